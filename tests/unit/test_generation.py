"""plugins/modules/lcm_generation.py (+ plugins/module_utils/lcm_generation_*.py): record / drift / restore
on real files in a temporary tree."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from pathlib import Path
from types import ModuleType

import ansible.module_utils
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    # Ansible ships plugins/module_utils (ansible.cfg module_utils) with the module; here: the same path.
    utils = str(ROOT / "plugins/module_utils")
    if utils not in ansible.module_utils.__path__:
        ansible.module_utils.__path__.append(utils)
    spec = importlib.util.spec_from_file_location(
        "lcm_generation", ROOT / "plugins/modules/lcm_generation.py"
    )
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


gen = _load()


class Packages:
    """Stands in for dpkg on the unit level (the lab test uses the real dpkg): name -> version."""

    def __init__(self, **versions: str | None) -> None:
        self.v = dict(versions)

    def __call__(self, names: list[str]) -> dict[str, str | None]:
        return {n: self.v.get(n) for n in names}


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "slurm.conf").write_text("ClusterName=lab\n")
    (etc / "munge.key").write_bytes(b"\x01" * 32)
    os.chmod(etc / "munge.key", 0o400)
    managed = tmp_path / "managed.d"
    managed.mkdir()
    (managed / "slurm.json").write_text(
        json.dumps(
            {
                "role": "slurm",
                "files": [str(etc / "slurm.conf")],
                "packages": ["slurmd"],
                "services": ["slurmd"],
            }
        )
    )
    (managed / "munge.json").write_text(
        json.dumps({"role": "munge", "files": [str(etc / "munge.key")], "packages": ["munge"]})
    )
    return {"etc": etc, "managed": managed, "gens": tmp_path / "generations"}


def _rec(t: dict[str, Path], pk: Packages, lock: str = "L1", spec: str = "S1", **kw: object) -> tuple:
    return gen.record(t["gens"], t["managed"], lock, spec, "abc123", pkg_query=pk, **kw)


def test_first_record_then_no_new_generation_when_nothing_changed(tree: dict[str, Path]) -> None:
    pk = Packages(slurmd="22.05.8-4", munge="0.5.15-2")
    changed, n, rec = _rec(tree, pk)
    assert (changed, n) == (True, 1)
    assert os.readlink(tree["gens"] / "current") == "1.json"
    conf = str(tree["etc"] / "slurm.conf")
    assert rec["roles"]["slurm"]["files"][conf]["sha256"] == hashlib.sha256(b"ClusterName=lab\n").hexdigest()
    assert rec["roles"]["munge"]["files"][str(tree["etc"] / "munge.key")]["mode"] == "0400"
    assert rec["roles"]["slurm"]["packages"] == {"slurmd": "22.05.8-4"}
    assert (tree["gens"] / "1" / "files" / conf.lstrip("/")).read_text() == "ClusterName=lab\n"
    assert oct(tree["gens"].stat().st_mode & 0o777) == "0o700"
    changed, n, _ = _rec(tree, pk)
    assert (changed, n) == (False, 1)
    assert gen.generations(tree["gens"]) == [1]


@pytest.mark.parametrize("what", ["file", "mode", "package", "lock", "spec", "manifest"])
def test_any_difference_makes_a_new_generation(tree: dict[str, Path], what: str) -> None:
    pk = Packages(slurmd="22.05.8-4", munge="0.5.15-2")
    _rec(tree, pk)
    lock, spec = "L1", "S1"
    if what == "file":
        (tree["etc"] / "slurm.conf").write_text("ClusterName=lab2\n")
    elif what == "mode":
        os.chmod(tree["etc"] / "slurm.conf", 0o600)
    elif what == "package":
        pk.v["slurmd"] = "22.05.9-1"
    elif what == "lock":
        lock = "L2"
    elif what == "spec":
        spec = "S2"
    else:
        (tree["managed"] / "munge.json").unlink()
    changed, n, rec = _rec(tree, pk, lock, spec)
    assert (changed, n, rec["previous"]) == (True, 2, 1)


def test_check_mode_writes_nothing(tree: dict[str, Path]) -> None:
    changed, n, _ = _rec(tree, Packages(), check=True)
    assert (changed, n) == (True, 1) and not tree["gens"].exists()


def test_drift_reports_hand_edit_and_package_change(tree: dict[str, Path]) -> None:
    pk = Packages(slurmd="22.05.8-4", munge="0.5.15-2")
    _rec(tree, pk)
    assert gen.drift(tree["gens"], tree["managed"], pk) == (1, [])
    conf = tree["etc"] / "slurm.conf"
    conf.write_text("ClusterName=lab\nSlurmctldDebug=debug5\n")
    pk.v["munge"] = None
    cur, diffs = gen.drift(tree["gens"], tree["managed"], pk)
    assert cur == 1
    kinds = {(d["kind"], d.get("path") or d.get("name")) for d in diffs}
    assert kinds == {("file", str(conf)), ("package", "munge")}
    fdiff = next(d for d in diffs if d["kind"] == "file")
    assert (
        fdiff["actual"]["sha256"]
        == hashlib.sha256(conf.read_bytes()).hexdigest()
        != fdiff["expected"]["sha256"]
    )


def test_drift_without_generation_is_an_error(tree: dict[str, Path]) -> None:
    with pytest.raises(gen.GenerationError, match="no current generation"):
        gen.drift(tree["gens"], tree["managed"], Packages())


def test_restore_previous_generation(tree: dict[str, Path]) -> None:
    pk = Packages(slurmd="22.05.8-4", munge="0.5.15-2")
    _rec(tree, pk)
    conf = tree["etc"] / "slurm.conf"
    conf.write_text("ClusterName=new\n")
    os.chmod(conf, 0o640)
    new_file = tree["etc"] / "gres.conf"
    new_file.write_text("Name=gpu\n")
    (tree["managed"] / "slurm.json").write_text(
        json.dumps(
            {
                "role": "slurm",
                "files": [str(conf), str(new_file)],
                "packages": ["slurmd"],
                "services": ["slurmd"],
            }
        )
    )
    (tree["managed"] / "extra.json").write_text(json.dumps({"role": "extra", "files": [], "packages": []}))
    pk.v["slurmd"] = "22.05.9-1"
    assert _rec(tree, pk, "L2")[1] == 2

    res = gen.restore(tree["gens"], tree["managed"], 1, pk)
    assert res["restored_files"] == [str(conf)]
    assert res["packages"] == {"slurmd": "22.05.8-4"}
    assert res["services"] == ["slurmd"]
    assert res["removed_manifests"] == ["extra"]
    assert conf.read_text() == "ClusterName=lab\n" and oct(conf.stat().st_mode & 0o777) == "0o644"
    assert json.loads((tree["managed"] / "slurm.json").read_text())["files"] == [str(conf)]
    # the playbook installs the package, then records: a new generation that says it is a rollback of 1
    pk.v["slurmd"] = "22.05.8-4"
    changed, n, rec = gen.record(
        tree["gens"], tree["managed"], None, None, "abc", rollback_of=1, pkg_query=pk
    )
    assert (changed, n, rec["rollback_of"], rec["lock_sha256"]) == (True, 3, 1, "L1")
    assert gen.drift(tree["gens"], tree["managed"], pk) == (3, [])
    # a converge with generation 1's inputs right after the rollback creates nothing new
    assert _rec(tree, pk, "L1", "S1")[:2] == (False, 3)


def test_restore_check_mode_changes_nothing(tree: dict[str, Path]) -> None:
    pk = Packages(slurmd="1", munge="1")
    _rec(tree, pk)
    conf = tree["etc"] / "slurm.conf"
    conf.write_text("edited\n")
    res = gen.restore(tree["gens"], tree["managed"], 1, pk, check=True)
    assert res["restored_files"] == [str(conf)] and res["changed"]
    assert conf.read_text() == "edited\n"


def test_restore_unknown_generation(tree: dict[str, Path]) -> None:
    _rec(tree, Packages())
    with pytest.raises(gen.GenerationError, match=r"generation 7 does not exist on this node \(have: 1\)"):
        gen.restore(tree["gens"], tree["managed"], 7, Packages())


def test_tampered_stored_copy_is_not_restored(tree: dict[str, Path]) -> None:
    pk = Packages()
    _rec(tree, pk)
    conf = tree["etc"] / "slurm.conf"
    (tree["gens"] / "1" / "files" / str(conf).lstrip("/")).write_text("evil\n")
    conf.write_text("edited\n")
    with pytest.raises(gen.GenerationError, match="does not match generation 1"):
        gen.restore(tree["gens"], tree["managed"], 1, pk)
    assert conf.read_text() == "edited\n"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("{not json", "not valid JSON"),
        ('{"role": "other", "files": []}', 'expected {"role": "slurm"'),
        ('{"role": "slurm", "files": ["etc/slurm.conf"]}', "absolute paths"),
        ('{"role": "slurm", "files": "/etc/slurm.conf"}', "files must be a list"),
    ],
)
def test_bad_manifest_is_a_clear_error(tree: dict[str, Path], body: str, message: str) -> None:
    (tree["managed"] / "slurm.json").write_text(body)
    with pytest.raises(gen.GenerationError, match=message):
        _rec(tree, Packages())


def test_dpkg_versions_reads_the_real_dpkg_database() -> None:
    got = gen.dpkg_versions(["dpkg", "lcm-no-such-package"])
    assert got["lcm-no-such-package"] is None
    assert got["dpkg"] and got["dpkg"][0].isdigit()
