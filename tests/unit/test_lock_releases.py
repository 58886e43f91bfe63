"""Two Debian releases (issue 18): the spec's cluster.os.release picks the lock's pins
(lcm_lock.releases.<release>.packages), validation names the per-release field, and the Debian 13 lab
spec (inventories/lab-trixie) is the lab's with only the release and the layers above the scheduler
changed."""

from __future__ import annotations

import copy
import json
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


def _this_release() -> str:
    line = next(
        ln for ln in Path("/etc/os-release").read_text().splitlines() if ln.startswith("VERSION_CODENAME=")
    )
    return line.split("=", 1)[1].strip('"')


@pytest.mark.parametrize("spec_release", ["same", "other"])
def test_the_release_check_reads_the_node_not_a_stale_fact_cache(tmp_path: Path, spec_release: str) -> None:
    """roles/common's release check on this machine, with Ansible's fact cache claiming another release (as
    after a node was reinstalled within the cache's 2 h): the check reads the node, so it passes when the spec
    names what the machine runs and fails naming the machine's real release otherwise."""
    from _role_run import run_role, spec

    real = _this_release()
    other = next(r for r in RELEASES if r != real)
    cache = tmp_path / "facts"
    cache.mkdir()
    stale = {"ansible_distribution": "Debian", "ansible_distribution_release": "jessie",
             "ansible_distribution_version": "8", "ansible_distribution_major_version": "8"}  # fmt: skip
    # ansible-core 2.19's jsonfile cache: s1_<host> = {"__payload__": "<the facts as JSON>"}
    cached = cache / "s1_localhost"
    cached.write_text(json.dumps({"__payload__": json.dumps(stale)}))
    cfg = f"gathering = smart\nfact_caching = jsonfile\nfact_caching_connection = {cache}\n"
    want = real if spec_release == "same" else other
    cluster = spec() | {"os": {"release": want}}
    run = run_role("common", tmp_path, {"cluster": cluster}, tasks_from="release", cfg_extra=cfg)
    if spec_release == "same":
        assert run.rc == 0, run.failed_msgs or run.stdout[-2000:]
    else:
        assert run.rc != 0
        msg = " ".join(run.failed_msgs)
        assert (
            "localhost runs Debian" in msg and f"({real})" in msg and f"cluster.os.release is {other}" in msg
        )
        assert "jessie" not in msg
    # the file is the cache Ansible read and wrote: it now holds what the node runs
    assert json.loads(json.loads(cached.read_text())["__payload__"])["ansible_distribution_release"] == real
