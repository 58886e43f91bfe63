"""The munge key and the accounting database password never leak: not into the repository or the
controller's caches, not into Ansible's output (a converge of the munge + slurmdbd + Slurm layer at
-vvv), not into any node's logs.

Every form an accident would produce is looked for: the raw bytes (a 32-byte run of them), base64 (the
whole key and a 64-character aligned prefix), hex (the first 32 bytes). The key's file itself is
0400 munge:munge (tests/infra/test_munge.py). The database password (roles/slurmdbd, generated on the
accounting host, base64 text) is looked for whole and as a 24-character prefix; its files are root 0600
and slurm 0600 (tests/infra/test_slurmdbd.py).

Runs with the lab up (LCM_LAB=1 forces): pytest -m lab tests/faults/test_secrets_leak.py (part of
scripts/faults, not of molecule verify).

The generation store (/var/lib/lcm) is searched too: it keeps copies of managed files for rollback, but
a manifest's secrets (the munge key) are recorded by sha256/mode/owner only, and a record removes any copy
an older generation kept (roles/_generation, plugins/module_utils/lcm_generation_ops.py).
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NODES = ("lab-ctl", "lab-node1", "lab-node2")
SKIP_DIRS = {".git", ".venv", "__pycache__", ".ruff_cache", ".pytest_cache"}

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(
        not (ROOT / ".lab" / "READY").exists() and os.environ.get("LCM_LAB") != "1",
        reason="the lab is not up (.lab/READY missing; LCM_LAB=1 forces)",
    ),
]


def _exec(node: str, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["podman", "exec", node, *argv], capture_output=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def needles() -> dict[str, bytes]:
    if shutil.which("podman") is None:
        pytest.fail("podman is missing")
    p = _exec("lab-ctl", "cat", "/etc/munge/munge.key")
    assert p.returncode == 0 and len(p.stdout) >= 32, p.stderr
    key = p.stdout
    b64 = base64.b64encode(key)
    pw = _exec("lab-ctl", "cat", "/etc/slurm/lcm-slurmdbd-db.password")
    assert pw.returncode == 0 and len(pw.stdout.strip()) >= 16, pw.stderr
    password = pw.stdout.strip()
    return {
        "db password": password,
        "db password prefix": password[:24],
        "raw bytes": key[:32],
        "base64": b64,
        "base64 prefix": base64.b64encode(key[:48]),
        "base64 (unpadded url)": base64.urlsafe_b64encode(key[:48]).rstrip(b"="),
        "hex": key[:32].hex().encode(),
        "HEX": key[:32].hex().upper().encode(),
    }


def _found(data: bytes, needles: dict[str, bytes]) -> list[str]:
    return [name for name, n in needles.items() if n in data]


def test_not_in_the_repository_or_the_controllers_caches(needles: dict[str, bytes]) -> None:
    hits = []
    scanned = 0
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
        for f in filenames:
            path = Path(dirpath) / f
            if path.is_symlink() or not path.is_file():
                continue
            try:
                data = path.read_bytes()
            except OSError:
                continue
            scanned += 1
            if found := _found(data, needles):
                hits.append(f"{path.relative_to(ROOT)}: {', '.join(found)}")
    assert scanned > 100, "the scan saw almost nothing"
    assert not hits, hits


def test_not_in_ansible_output_of_a_converge(needles: dict[str, bytes], tmp_path: Path) -> None:
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_FORCE_COLOR="false")
    env["PATH"] = f"{ROOT / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    nodes = subprocess.run(
        ["podman", "ps", "--format", "{{.Names}}"], capture_output=True, text=True, check=False
    ).stdout.split()
    env["LAB_COMPUTE_NODES"] = str(len([n for n in nodes if n.startswith("lab-node")]))  # the running lab
    p = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "ansible-playbook"), "site.yml", "--tags", "slurm", "-vvv"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        timeout=900,
        check=False,
    )
    out = p.stdout + p.stderr
    (tmp_path / "converge.log").write_bytes(out)
    assert p.returncode == 0, out[-3000:].decode(errors="replace")
    assert b"munge" in out and len(out) > 10_000, "the converge printed nothing of the munge layer"
    assert b"slurmdbd" in out, "the converge printed nothing of the accounting role"
    assert not _found(out, needles), _found(out, needles)


@pytest.mark.parametrize("node", NODES)
def test_not_in_any_node_log(needles: dict[str, bytes], node: str) -> None:
    journal = _exec(node, "journalctl", "--no-pager", "-o", "cat")
    assert journal.returncode == 0, journal.stderr
    assert not _found(journal.stdout, needles), ("journal", _found(journal.stdout, needles))
    logs = _exec(node, "sh", "-c", "find /var/log /var/lib/lcm -type f -size -50M -exec cat {} + 2>/dev/null")
    assert len(logs.stdout) > 0, "no log files read"
    assert not _found(logs.stdout, needles), ("/var/log, /var/lib/lcm", _found(logs.stdout, needles))
