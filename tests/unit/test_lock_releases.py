"""Two Debian releases (issue 18): the spec's cluster.os.release picks the lock's pins
(lcm_lock.releases.<release>.packages), validation names the per-release field, and the Debian 13 lab
spec (inventories/lab-trixie) is the lab's with only the release and the layers above the scheduler
changed."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from lcm_runner.spec import fill_defaults, load_cluster, validate
from lcm_runner.spec.lock_shape import RELEASES

ROOT = Path(__file__).resolve().parents[2]
RAW = yaml.safe_load((ROOT / "versions.lock.yml").read_text())["lcm_lock"]
LAB = load_cluster(ROOT / "inventories/lab")
TRIXIE = load_cluster(ROOT / "inventories/lab-trixie")
H200 = load_cluster(ROOT / "inventories/example-h200")


def _msgs(spec: dict[str, Any], lock: dict[str, Any]) -> list[str]:
    return [str(e) for e in validate(spec, None, lock, {})]


def _release(spec: dict[str, Any], release: str) -> dict[str, Any]:
    out = copy.deepcopy(spec)
    out["os"] = {"release": release}
    return out


def test_release_defaults_to_bookworm_and_is_checked() -> None:
    assert fill_defaults(LAB)["os"] == {"release": "bookworm"}
    assert fill_defaults(TRIXIE)["os"] == {"release": "trixie"}
    (msg,) = _msgs(_release(LAB, "jessie"), copy.deepcopy(RAW))
    assert msg.startswith('cluster.os.release = "jessie": expected one of')


@pytest.mark.parametrize("release", RELEASES)
def test_the_repository_lock_fits_every_example_spec_on_every_release(release: str) -> None:
    for spec in (LAB, H200, TRIXIE):
        assert _msgs(_release(spec, release), copy.deepcopy(RAW)) == [], (spec["name"], release)


def test_a_missing_package_is_named_in_the_specs_release() -> None:
    lock = copy.deepcopy(RAW)
    del lock["releases"]["trixie"]["packages"]["slurmd"]
    (msg,) = _msgs(TRIXIE, lock)
    assert msg.startswith(
        "lcm_lock.releases.trixie.packages.slurmd = null: expected an entry: cluster.layers.slurm is true"
    )
    assert _msgs(LAB, lock) == [], "the bookworm cluster does not read trixie's pins"


def test_version_pairs_are_checked_within_the_release() -> None:
    lock = copy.deepcopy(RAW)
    lock["releases"]["trixie"]["packages"]["slurmdbd"] = "22.05.8-4+deb12u3"
    (msg,) = _msgs(TRIXIE, lock)
    assert msg == (
        'lcm_lock.releases.trixie.packages.slurmdbd = "22.05.8-4+deb12u3": expected version '
        "24.11.5-4+deb13u1 like lcm_lock.releases.trixie.packages.slurm-client "
        "(slurmdbd is the Slurm release of the nodes)"
    )


def test_a_release_the_lock_does_not_pin_is_refused() -> None:
    lock = copy.deepcopy(RAW)
    del lock["releases"]["trixie"]
    (msg,) = _msgs(TRIXIE, lock)
    assert msg == (
        "lcm_lock.releases.trixie = null: expected the packages of cluster.os.release trixie "
        "(the lock pins bookworm)"
    )


@pytest.mark.parametrize(
    ("change", "path"),
    [
        (lambda lk: lk["releases"].update(sid={"packages": {}}), "lcm_lock.releases.sid"),
        (
            lambda lk: lk["releases"]["trixie"].update(packages=["slurmd"]),
            "lcm_lock.releases.trixie.packages",
        ),
        (
            lambda lk: lk["releases"]["trixie"]["packages"].update(slurmd="24.*"),
            "lcm_lock.releases.trixie.packages.slurmd",
        ),
        (lambda lk: lk.update(releases=["bookworm"]), "lcm_lock.releases"),
    ],
)
def test_malformed_releases_are_named(change: Any, path: str) -> None:
    lock = copy.deepcopy(RAW)
    change(lock)
    msgs = _msgs(TRIXIE, lock)
    assert msgs and msgs[0].startswith(path + " = "), msgs


def test_the_trixie_lab_is_the_lab_but_for_release_and_upper_layers() -> None:
    lab, tri = copy.deepcopy(LAB), copy.deepcopy(TRIXIE)
    assert tri.pop("os") == {"release": "trixie"} and "os" not in lab
    lab_layers, tri_layers = lab.pop("layers"), tri.pop("layers")
    assert lab == tri, "inventories/lab-trixie's spec drifted from inventories/lab's"
    # through the scheduler layer: what it turns on, the lab turns on too
    on = {k for k, v in tri_layers.items() if v}
    assert {"slurm", "storage"} <= on and on <= {k for k, v in lab_layers.items() if v}
    for name in ("hosts.py", "group_vars/all/lab.yml", "group_vars/all/lock.yml"):
        assert (ROOT / "inventories/lab-trixie" / name).resolve() == (
            ROOT / ("versions.lock.yml" if name.endswith("lock.yml") else f"inventories/lab/{name}")
        ).resolve(), name
