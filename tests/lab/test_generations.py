"""Generations, drift and rollback on the podman lab (real nodes over SSH, real dpkg/apt).

Runs when the lab is up (.lab/READY, or LCM_LAB=1 to force):
    pytest -m lab tests/lab/test_generations.py
test_isolated_cycle uses its own directories and a test manifest on lab-node1 (a test config file and the
tzdata package, moved between two versions the node's apt offers), so it changes no other layer's state.
test_real_managed_files uses the manifests the roles wrote and only appends a comment to a managed file for
a moment (restored byte for byte).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INV = ROOT / "inventories" / "lab"
NODE = "lab-node1"
TEST_DIRS = {
    "lcm_generations_dir": "/var/lib/lcm-test/generations",
    "lcm_managed_dir": "/var/lib/lcm-test/managed.d",
}
CONF = "/etc/lcm-test/app.conf"
MDIR = TEST_DIRS["lcm_managed_dir"]

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(
        not (ROOT / ".lab" / "READY").exists() and os.environ.get("LCM_LAB") != "1",
        reason="the lab is not up (.lab/READY missing; LCM_LAB=1 forces)",
    ),
]


def _env() -> dict[str, str]:
    return {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}


def play(playbook: str, *args: str, extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("ansible-playbook")
    assert exe
    cmd = [exe, "-i", str(INV), playbook, *args]
    if extra:
        cmd += ["-e", json.dumps(extra)]
    return subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=600, cwd=ROOT)


def sh(host: str, command: str) -> str:
    exe = shutil.which("ansible")
    assert exe
    out = subprocess.run(
        [exe, "-i", str(INV), host, "-m", "ansible.builtin.shell", "-a", command, "-o"],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    # oneline output: "host | CHANGED | rc=0 | (stdout) line1\nline2"
    return (
        out.stdout.split("(stdout) ", 1)[1].strip().replace("\\n", "\n") if "(stdout) " in out.stdout else ""
    )


def setup_node(content: str, version: str) -> None:
    manifest = json.dumps({"role": "lcmtest", "files": [CONF], "packages": ["tzdata"], "services": []})
    sh(
        NODE,
        f"set -e; mkdir -p /etc/lcm-test {MDIR}; printf '%s\\n' '{content}' > {CONF}; "
        f"echo '{manifest}' > {MDIR}/lcmtest.json; apt-mark unhold tzdata >/dev/null; "
        f"DEBIAN_FRONTEND=noninteractive apt-get install -y -q --allow-downgrades "
        f"tzdata={version} >/dev/null",
    )


@pytest.fixture
def tz_versions() -> tuple[str, str, str]:
    installed = sh(NODE, "dpkg-query -W -f='${Version}' tzdata")
    offered = re.findall(r"tzdata \| (\S+) \|", sh(NODE, "apt-cache madison tzdata"))
    others = [v for v in dict.fromkeys(offered) if v != installed]
    if not others:
        pytest.skip(f"the node's apt offers no second tzdata version ({offered})")
    yield installed, others[0], installed
    sh(
        NODE,
        f"apt-mark unhold tzdata >/dev/null; DEBIAN_FRONTEND=noninteractive apt-get install -y -q "
        f"--allow-downgrades tzdata={installed} >/dev/null; rm -rf /var/lib/lcm-test /etc/lcm-test",
    )


def test_isolated_cycle(tz_versions: tuple[str, str, str]) -> None:
    v1, v2, _ = tz_versions
    lim = ("--limit", NODE)
    setup_node("setting=one", v1)
    out = play("playbooks/generation.yml", *lim, extra=TEST_DIRS)
    assert out.returncode == 0 and f"{NODE}: generation 1 recorded" in out.stdout, out.stdout
    out = play("playbooks/generation.yml", *lim, extra=TEST_DIRS)
    assert f"{NODE}: generation 1 unchanged" in out.stdout, out.stdout

    setup_node("setting=two", v2)
    out = play("playbooks/generation.yml", *lim, extra=TEST_DIRS)
    assert f"{NODE}: generation 2 recorded" in out.stdout, out.stdout
    gen2 = json.loads(sh(NODE, f"cat {TEST_DIRS['lcm_generations_dir']}/2.json"))
    assert gen2["roles"]["lcmtest"]["packages"] == {"tzdata": v2}

    sh(NODE, f"echo 'hand=edit' >> {CONF}")
    out = play("playbooks/drift.yml", *lim, extra=TEST_DIRS)
    assert out.returncode != 0
    assert f"- lcmtest: file {CONF}: expected sha256" in out.stdout, out.stdout

    out = play("playbooks/rollback.yml", *lim, extra={**TEST_DIRS, "generation": "1"})
    assert out.returncode == 0, out.stdout
    assert f"{NODE}: generation 3 recorded (rollback of 1)" in out.stdout
    assert sh(NODE, f"cat {CONF}") == "setting=one"
    assert sh(NODE, "dpkg-query -W -f='${Version}' tzdata") == v1
    assert "tzdata" in sh(NODE, "apt-mark showhold")
    out = play("playbooks/drift.yml", *lim, extra=TEST_DIRS)
    assert out.returncode == 0 and "no drift from generation 3" in out.stdout, out.stdout


def test_real_managed_files() -> None:
    first = play("playbooks/generation.yml")
    assert first.returncode == 0, first.stdout
    second = play("playbooks/generation.yml")
    assert second.returncode == 0, second.stdout
    nodes = re.findall(r"(\S+): generation (\d+) (recorded|unchanged)", second.stdout)
    assert nodes and all(state == "unchanged" for _, _, state in nodes), second.stdout

    files: list[str] = []
    for name in sh(NODE, "ls /var/lib/lcm/managed.d").split():
        files += json.loads(sh(NODE, f"cat /var/lib/lcm/managed.d/{name}"))["files"]
    files = [f for f in files if not f.endswith("key")]  # never touch a secret
    target = next(f for f in files if sh(NODE, f"test -f {f} && echo yes || true") == "yes")
    backup = sh(NODE, f"base64 -w0 {target}")
    try:
        sh(NODE, f"echo '# lcm drift test: hand edit' >> {target}")
        out = play("playbooks/drift.yml", "--limit", NODE)
        assert out.returncode != 0
        assert f"file {target}: expected sha256" in out.stdout, out.stdout
    finally:
        sh(NODE, f"echo {backup} | base64 -d > {target}")
    out = play("playbooks/drift.yml", "--limit", NODE)
    assert out.returncode == 0, out.stdout


APT_MIRROR_PLAY = """
- name: apt mirror mode
  hosts: lab-node2
  gather_facts: false
  tasks:
    - name: Install through _packages in mirror mode
      ansible.builtin.include_role:
        name: _packages
      vars:
        _packages_names: [numactl]
        lcm_apt_mirror: http://deb.debian.org/debian
        lcm_apt_security_mirror: http://deb.debian.org/debian-security
"""


def test_apt_mirror_mode_uses_only_the_mirror(tmp_path: Path) -> None:
    """roles/_packages with lcm_apt_mirror: only lcm-mirror.sources stays active (restored afterwards)."""
    node = "lab-node2"
    before = sh(node, "ls /etc/apt/sources.list.d/")
    pb = tmp_path / "apt_mirror.yml"
    pb.write_text(APT_MIRROR_PLAY)
    try:
        out = play(str(pb))
        assert out.returncode == 0, out.stdout
        again = play(str(pb))
        assert re.search(rf"{node}\s+: ok=\d+\s+changed=0 ", again.stdout), again.stdout
        active = sh(node, "ls /etc/apt/sources.list.d/ /etc/apt/sources.list 2>/dev/null || true").split()
        assert [f for f in active if f.endswith((".list", ".sources"))] == ["lcm-mirror.sources"], active
        uris = set(sh(node, "apt-get indextargets --format '$(URI)' | sed 's|/dists/.*||'").split())
        assert uris == {"http://deb.debian.org/debian", "http://deb.debian.org/debian-security"}, uris
    finally:
        sh(
            node,
            "cd /etc/apt/sources.list.d; for f in *.lcm-disabled; do "
            '[ -e "$f" ] && mv "$f" "${f%.lcm-disabled}"; done; '
            "rm -f lcm-mirror.sources /var/lib/lcm/managed.d/_packages.json; apt-get update -qq",
        )
    assert sh(node, "ls /etc/apt/sources.list.d/") == before
