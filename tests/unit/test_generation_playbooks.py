"""playbooks/generation.yml, drift.yml and rollback.yml through ansible-playbook on this machine.

The node is localhost over the local connection with its generations and manifests under tmp_path, so the
real module, role and playbooks run; package rollback needs a node whose packages may change, which is the
lab test (tests/lab/test_generations.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def node(tmp_path: Path) -> dict[str, Path]:
    inv = tmp_path / "inv"
    (inv / "group_vars" / "all").mkdir(parents=True)
    host = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "ansible_become": False,
    }
    (inv / "hosts.yml").write_text(
        yaml.safe_dump({"all": {"children": {"cluster": {"hosts": {"node1": host}}}}})
    )
    shutil.copy(ROOT / "versions.lock.yml", inv / "group_vars" / "all" / "lock.yml")
    shutil.copy(
        ROOT / "inventories/lab/group_vars/all/cluster.yml", inv / "group_vars" / "all" / "cluster.yml"
    )
    etc, managed, gens = tmp_path / "etc", tmp_path / "managed.d", tmp_path / "generations"
    etc.mkdir()
    managed.mkdir()
    (etc / "slurm.conf").write_text("ClusterName=lab\n")
    (managed / "slurm.json").write_text(
        json.dumps({"role": "slurm", "files": [str(etc / "slurm.conf")], "packages": ["dpkg"]})
    )
    (inv / "group_vars" / "all" / "dirs.yml").write_text(
        yaml.safe_dump({"lcm_generations_dir": str(gens), "lcm_managed_dir": str(managed)})
    )
    return {"inv": inv, "etc": etc, "managed": managed, "gens": gens, "tmp": tmp_path}


def _play(node: dict[str, Path], playbook: str, *args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("ansible-playbook")
    assert exe
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_LOCAL_TEMP": str(node["tmp"] / "at"),
    }
    return subprocess.run(
        [exe, "-i", str(node["inv"]), str(ROOT / "playbooks" / playbook), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_record_drift_rollback_cycle(node: dict[str, Path]) -> None:
    conf = node["etc"] / "slurm.conf"
    out = _play(node, "generation.yml")
    assert out.returncode == 0, out.stdout
    assert "node1: generation 1 recorded" in out.stdout
    rec = json.loads((node["gens"] / "1.json").read_text())
    assert rec["roles"]["slurm"]["packages"]["dpkg"]  # the real installed version of dpkg
    assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?|[0-9a-f]+(-dirty)?", rec["git_revision"]), rec["git_revision"]

    # second converge, nothing changed: no new generation
    out = _play(node, "generation.yml")
    assert out.returncode == 0 and "node1: generation 1 unchanged" in out.stdout, out.stdout
    assert sorted(p.name for p in node["gens"].glob("*.json")) == ["1.json"]

    # clean: drift exits 0
    out = _play(node, "drift.yml")
    assert out.returncode == 0 and "no drift from generation 1" in out.stdout, out.stdout

    # the plan (check mode) after a change says a generation would be recorded, and writes nothing
    conf.write_text("ClusterName=lab\nSchedulerParameters=x\n")
    out = _play(node, "generation.yml", "--check", "--diff")
    assert out.returncode == 0 and "generation 2 would be recorded (check mode)" in out.stdout, out.stdout
    assert not (node["gens"] / "2.json").exists()

    # a converge records generation 2; a hand edit after it is drift (non-zero exit, file named)
    assert _play(node, "generation.yml").returncode == 0
    conf.write_text("ClusterName=lab\nSchedulerParameters=x\nDebugFlags=hand-edit\n")
    out = _play(node, "drift.yml")
    assert out.returncode != 0
    assert f"- slurm: file {conf}: expected sha256" in out.stdout, out.stdout
    assert "DRIFT on node1 against generation 2: 1 item(s)" in out.stdout

    # rollback to generation 1 restores the file and records generation 3 = rollback of 1
    out = _play(node, "rollback.yml", "-e", "generation=1")
    assert out.returncode == 0, out.stdout
    assert conf.read_text() == "ClusterName=lab\n"
    assert "node1: generation 3 recorded (rollback of 1)" in out.stdout
    rec3 = json.loads((node["gens"] / "3.json").read_text())
    assert rec3["rollback_of"] == 1 and rec3["roles"] == rec["roles"]
    assert os.readlink(node["gens"] / "current") == "3.json"
    assert _play(node, "drift.yml").returncode == 0


def test_rollback_needs_a_valid_generation(node: dict[str, Path]) -> None:
    assert _play(node, "generation.yml").returncode == 0
    out = _play(node, "rollback.yml")
    assert out.returncode != 0 and "rollback.yml needs -e generation=<n>" in out.stdout
    out = _play(node, "rollback.yml", "-e", "generation=9")
    assert out.returncode != 0 and "generation 9 does not exist on this node (have: 1)" in out.stdout
    assert (node["etc"] / "slurm.conf").read_text() == "ClusterName=lab\n"


def test_drift_before_any_generation_is_an_error(node: dict[str, Path]) -> None:
    out = _play(node, "drift.yml")
    assert out.returncode != 0 and "no current generation" in out.stdout


def test_secrets_are_never_in_the_store(node: dict[str, Path]) -> None:
    """Issue 10: secrets are recorded by hash only; older copies go; a rollback keeps the secret."""
    key = node["etc"] / "munge.key"
    key.write_bytes(b"\x07" * 32)
    key.chmod(0o400)
    plain = {"role": "munge", "files": [str(key)], "packages": []}
    (node["managed"] / "munge.json").write_text(json.dumps(plain))
    assert _play(node, "generation.yml").returncode == 0  # before the marking: generation 1 copies the key
    copy = node["gens"] / "1" / "files" / str(key).lstrip("/")
    assert copy.read_bytes() == key.read_bytes()

    (node["managed"] / "munge.json").write_text(json.dumps({**plain, "secrets": [str(key)]}))
    out = _play(node, "generation.yml")
    assert out.returncode == 0 and "node1: generation 1 unchanged" in out.stdout, out.stdout
    assert f"removed the stored copies of {key} from generation(s) 1" in out.stdout, out.stdout
    assert not copy.exists()
    assert not [p for p in node["gens"].rglob("*") if p.is_file() and b"\x07" * 32 in p.read_bytes()]

    key.chmod(0o600)
    key.write_bytes(b"\x08" * 32)
    out = _play(node, "drift.yml")
    assert out.returncode != 0 and f"- munge: file {key} (secret): expected sha256" in out.stdout, out.stdout

    out = _play(node, "rollback.yml", "-e", "generation=1")
    assert out.returncode == 0, out.stdout
    assert f"node1: kept the current {key}: secrets are" in out.stdout, out.stdout
    assert key.read_bytes() == b"\x08" * 32
    assert "node1: generation 2 recorded (rollback of 1)" in out.stdout, out.stdout


def test_manifest_entry_point_writes_what_the_module_reads(tmp_path: Path) -> None:
    """_generation's manifest entry point (every role calls it): lcm_managed_dir, canonical bytes, checks."""
    import ansible.module_utils
    from _role_run import run_role

    if str(ROOT / "plugins/module_utils") not in ansible.module_utils.__path__:
        ansible.module_utils.__path__.append(str(ROOT / "plugins/module_utils"))
    from ansible.module_utils.lcm_generation_store import manifest_text, parse_manifest

    managed = tmp_path / "managed.d"
    args = {
        "lcm_managed_dir": str(managed),
        "_generation_manifest_role": "munge",
        "_generation_manifest_files": ["/etc/munge/lcm-key-serial", "/etc/munge/lcm-key-serial"],
        "_generation_manifest_secret_paths": ["/etc/munge/munge.key"],
        "_generation_manifest_packages": ["munge", "libmunge2"],
        "_generation_manifest_services": ["munge.service"],
    }
    first = run_role("_generation", tmp_path, args, tasks_from="manifest")
    assert first.rc == 0, first.failed_msgs or first.stderr
    body = (managed / "munge.json").read_bytes()
    assert body == manifest_text(
        "munge",
        ["/etc/munge/lcm-key-serial"],
        ["libmunge2", "munge"],
        ["munge.service"],
        ["/etc/munge/munge.key"],
    )
    assert parse_manifest(managed / "munge.json")["secrets"] == ["/etc/munge/munge.key"]
    assert run_role("_generation", tmp_path, args, tasks_from="manifest").changed == 0
    # a mode changed by hand is put back (the bytes alone do not make it unchanged)
    (managed / "munge.json").chmod(0o600)
    assert run_role("_generation", tmp_path, args, tasks_from="manifest").changed == 1
    assert (managed / "munge.json").stat().st_mode & 0o7777 == 0o644
    named = run_role("_generation", tmp_path, args | {"_generation_manifest_role": "munge-2"}, "manifest")
    assert named.rc != 0 and any("role name (got 'munge-2')" in m for m in named.failed_msgs), named.stdout
    assert not (managed / "munge-2.json").exists()

    bad = run_role(
        "_generation", tmp_path, args | {"_generation_manifest_secret_paths": ["munge.key"]}, "manifest"
    )
    assert bad.rc != 0 and any("absolute paths" in m and "munge.key" in m for m in bad.failed_msgs), (
        bad.stdout
    )
    missing = run_role("_generation", tmp_path, {"lcm_managed_dir": str(managed)}, tasks_from="manifest")
    assert missing.rc != 0 and any("_generation_manifest_role" in m for m in missing.failed_msgs)
