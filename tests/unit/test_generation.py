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


# --- secrets: recorded by sha256/mode/owner only, never copied into the store ---------------

KEY = b"\x01" * 32


def _mark_munge_secret(t: dict[str, Path], services: tuple[str, ...] = ("munge.service",)) -> Path:
    key = t["etc"] / "munge.key"
    body = gen.manifest_text("munge", [], ["munge"], list(services), [str(key)])
    (t["managed"] / "munge.json").write_bytes(body)
    return key


def _leaks(t: dict[str, Path], secret: bytes) -> list[str]:
    """Every file under the generation store that holds the secret (raw, hex or base64)."""
    import base64

    needles = (secret, secret.hex().encode(), base64.b64encode(secret))
    return [str(p) for p in t["gens"].rglob("*") if p.is_file() and any(n in p.read_bytes() for n in needles)]


def test_manifest_text_is_what_ansible_to_nice_json_writes() -> None:
    from ansible.plugins.filter.core import to_nice_json

    body = {
        "role": "munge",
        "files": ["/etc/munge/lcm-key-serial", "/etc/munge/munge.key"],
        "packages": ["libmunge2", "munge"],
        "services": ["munge.service"],
        "secrets": ["/etc/munge/munge.key"],
    }
    got = gen.manifest_text("munge", ["/etc/munge/lcm-key-serial"], ["munge", "libmunge2"], ["munge.service"],
                            ["/etc/munge/munge.key"])  # fmt: skip
    assert got == (to_nice_json(body) + "\n").encode()


def test_secret_is_recorded_by_hash_but_never_copied(tree: dict[str, Path]) -> None:
    key = _mark_munge_secret(tree)
    changed, n, rec = _rec(tree, Packages(munge="1"))
    assert (changed, n) == (True, 1)
    st = rec["roles"]["munge"]["files"][str(key)]
    assert st["sha256"] == hashlib.sha256(KEY).hexdigest() and st["mode"] == "0400"
    assert rec["roles"]["munge"]["secrets"] == [str(key)]
    assert not (tree["gens"] / "1" / "files" / str(key).lstrip("/")).exists()
    conf = str(tree["etc"] / "slurm.conf")
    assert (tree["gens"] / "1" / "files" / conf.lstrip("/")).exists()  # other files are still copied
    assert _leaks(tree, KEY) == []
    assert _rec(tree, Packages(munge="1"))[:2] == (False, 1)


def test_drift_sees_a_changed_secret(tree: dict[str, Path]) -> None:
    key = _mark_munge_secret(tree)
    _rec(tree, Packages())
    os.chmod(key, 0o600)
    key.write_bytes(b"\x02" * 32)
    cur, diffs = gen.drift(tree["gens"], tree["managed"], Packages())
    assert cur == 1 and len(diffs) == 1
    d = diffs[0]
    assert (d["kind"], d["path"], d["hash_only"]) == ("file", str(key), True)
    assert d["actual"]["sha256"] == hashlib.sha256(b"\x02" * 32).hexdigest() != d["expected"]["sha256"]


def test_restore_keeps_the_current_secret_and_says_so(tree: dict[str, Path]) -> None:
    key = _mark_munge_secret(tree)
    pk = Packages()
    _rec(tree, pk)
    os.chmod(key, 0o600)
    key.write_bytes(b"\x02" * 32)  # a rotated key
    conf = tree["etc"] / "slurm.conf"
    conf.write_text("ClusterName=other\n")
    assert _rec(tree, pk)[1] == 2
    res = gen.restore(tree["gens"], tree["managed"], 1, pk)
    assert res["kept_secret_paths"] == [str(key)]
    assert res["restored_files"] == [str(conf)]
    assert res["services"] == ["slurmd"]  # munge's files were not touched: munge is not restarted
    assert key.read_bytes() == b"\x02" * 32 and conf.read_text() == "ClusterName=lab\n"
    # the manifest a restore writes is the one the role writes (secret marked)
    assert (tree["managed"] / "munge.json").read_bytes() == gen.manifest_text(
        "munge", [], ["munge"], ["munge.service"], [str(key)]
    )
    # check mode says the same and writes nothing
    conf.write_text("edited\n")
    res = gen.restore(tree["gens"], tree["managed"], 1, pk, check=True)
    assert res["kept_secret_paths"] == [str(key)] and conf.read_text() == "edited\n"


def test_restore_puts_back_a_secrets_mode_when_its_content_is_the_same(tree: dict[str, Path]) -> None:
    key = _mark_munge_secret(tree)
    _rec(tree, Packages())
    os.chmod(key, 0o644)
    res = gen.restore(tree["gens"], tree["managed"], 1, Packages())
    assert res["restored_files"] == [str(key)] and res["kept_secret_paths"] == []
    assert res["services"] == ["munge.service"]
    assert oct(key.stat().st_mode & 0o777) == "0o400" and key.read_bytes() == KEY


def test_copies_older_generations_kept_are_purged_once_marked_secret(tree: dict[str, Path]) -> None:
    """A store written before the marking holds the key: the next record takes it out."""
    pk = Packages(slurmd="1", munge="1")
    _rec(tree, pk)  # the fixture's munge.json does not mark the key
    (tree["etc"] / "slurm.conf").write_text("ClusterName=lab2\n")
    _rec(tree, pk)
    assert len(_leaks(tree, KEY)) == 2  # both generations copied it
    key = _mark_munge_secret(tree, services=())  # the same manifest as before, the key marked secret
    changed, n, rec = _rec(tree, pk, check=True)
    assert (n, rec["purged_secret_paths"]) == (2, {1: [str(key)], 2: [str(key)]})
    assert len(_leaks(tree, KEY)) == 2
    changed, n, rec = _rec(tree, pk)
    # nothing else differs: no new generation, but the copies are gone and the records say secret
    assert (changed, n, rec["purged_secret_paths"]) == (True, 2, {1: [str(key)], 2: [str(key)]})
    assert _leaks(tree, KEY) == [] and gen.generations(tree["gens"]) == [1, 2]
    for g in (1, 2):
        assert gen.load_generation(tree["gens"], g)["roles"]["munge"]["secrets"] == [str(key)]
    assert _rec(tree, pk)[:2] == (False, 2)
    assert gen.drift(tree["gens"], tree["managed"], pk) == (2, [])
    # a rollback to generation 1 (recorded before the marking) leaves the key alone
    key.chmod(0o600)
    key.write_bytes(b"\x03" * 32)
    res = gen.restore(tree["gens"], tree["managed"], 1, pk)
    assert res["kept_secret_paths"] == [str(key)] and key.read_bytes() == b"\x03" * 32


def test_restore_does_not_write_a_secret_the_manifests_mark_now(tree: dict[str, Path]) -> None:
    """A rollback before any record since the marking: the old copy is there, and still not used."""
    pk = Packages()
    _rec(tree, pk)
    key = _mark_munge_secret(tree)
    key.chmod(0o600)
    key.write_bytes(b"\x04" * 32)
    res = gen.restore(tree["gens"], tree["managed"], 1, pk)
    assert res["kept_secret_paths"] == [str(key)] and key.read_bytes() == b"\x04" * 32


@pytest.mark.parametrize(
    ("secrets", "files", "message"),
    [
        (["/etc/munge/munge.key"], [], "secrets must also be listed in files"),
        (["munge.key"], ["munge.key"], "absolute paths"),
        (["/etc/munge/../shadow"], ["/etc/munge/../shadow"], "absolute paths"),
        ("/etc/munge/munge.key", [], "secrets must be a list"),
    ],
)
def test_bad_secrets_are_a_clear_error(
    tree: dict[str, Path], secrets: object, files: list, message: str
) -> None:
    body = {"role": "munge", "files": files, "packages": [], "secrets": secrets}
    (tree["managed"] / "munge.json").write_text(json.dumps(body))
    with pytest.raises(gen.GenerationError, match=message):
        _rec(tree, Packages())
