"""site.yml's unchanged check on the lab (playbooks/unchanged.yml;
docs/lock-mirror-generations.md, "Unchanged converges").

Runs when the lab is up (.lab/READY, or LCM_LAB=1 to force), after a complete converge (molecule's, or
`ansible-playbook site.yml`):
    pytest -m lab tests/lab/test_converge_unchanged.py
- A plain `ansible-playbook site.yml` on the converged lab skips every layer play and changes nothing. When
  an earlier test left something changed (its reasons are printed), the first run converges in full and the
  second must then be the no-op.
- The decision itself (validate + the unchanged play, nothing else: `ansible-playbook` runs them as site.yml
  does) falls back to a full converge for each kind of change: a hand edit of a managed file, a managed unit
  stopped, different inputs (an extra var) - and is a no-op again once the change is undone.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INV = ROOT / "inventories" / "lab"
NODE = "lab-node1"
# the plays of lab .. generation in site.yml (tests/unit/test_converge_unchanged.py checks their patterns)
LAYER_PLAYS = 16

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(
        not (ROOT / ".lab" / "READY").exists() and os.environ.get("LCM_LAB") != "1",
        reason="the lab is not up (.lab/READY missing; LCM_LAB=1 forces)",
    ),
]


def _env() -> dict[str, str]:
    return {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_FORCE_COLOR": "false"}


def play(
    *playbooks: str, extra: dict[str, object] | None = None
) -> tuple[subprocess.CompletedProcess[str], float]:
    exe = shutil.which("ansible-playbook")
    assert exe
    cmd = [exe, "-i", str(INV), *playbooks]
    if extra:
        cmd += ["-e", json.dumps(extra)]
    t0 = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=1500, cwd=ROOT)
    return out, time.monotonic() - t0


def sh(host: str, command: str) -> str:
    exe = shutil.which("ansible")
    assert exe
    out = subprocess.run(
        [exe, "-i", str(INV), host, "-b", "-m", "ansible.builtin.shell", "-a", command, "-o"],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return (
        out.stdout.split("(stdout) ", 1)[1].strip().replace("\\n", "\n") if "(stdout) " in out.stdout else ""
    )


def decision(out: subprocess.CompletedProcess[str]) -> list[str]:
    """The unchanged play's report lines ("unchanged since ..." / "converging in full: ...")."""
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    return re.findall(r'"msg": "((?:unchanged since|converging in full)[^"]*)"', out.stdout)


def recap_changed(out: subprocess.CompletedProcess[str]) -> dict[str, int]:
    return {h: int(c) for h, c in re.findall(r"^(\S+)\s+: ok=\d+\s+changed=(\d+)", out.stdout, re.M)}


def is_noop(out: subprocess.CompletedProcess[str]) -> bool:
    lines = decision(out)
    return bool(lines) and all(x.startswith("unchanged since") for x in lines)


def test_plain_site_yml_on_the_converged_lab_skips_every_layer() -> None:
    first, t_first = play("site.yml")
    if is_noop(first):
        out, seconds = first, t_first
    else:
        print(f"first run converged in full ({t_first:.0f} s):", *sorted(set(decision(first))), sep="\n  ")
        out, seconds = play("site.yml")
    assert is_noop(out), decision(out)
    assert out.stdout.count("skipping: no hosts matched") == LAYER_PLAYS, out.stdout[-3000:]
    assert set(recap_changed(out).values()) == {0}, recap_changed(out)
    print(f"no-op site.yml: {seconds:.1f} s")


@pytest.fixture
def nccl_conf() -> str:
    """A managed file of lab-node1 (the nccl role's), put back byte for byte with its mode."""
    path = "/etc/nccl.conf"
    saved = sh(NODE, f"base64 -w0 {path}; echo; stat -c %a {path}").split("\n")
    yield path
    tmp = f"{path}.lcm-test"
    sh(NODE, f"echo {saved[0]} | base64 -d > {tmp} && chmod {saved[1]} {tmp} && mv {tmp} {path}")


def test_each_kind_of_change_makes_the_next_converge_full(nccl_conf: str) -> None:
    check = ("playbooks/validate.yml", "playbooks/unchanged.yml")
    out, _ = play(*check)
    if not is_noop(out):  # converge the lab first (the test above does when run alone)
        pytest.fail(f"the lab is not at its last converge: {sorted(set(decision(out)))}")

    # a hand edit of a managed file on one node: every node converges (all or nothing)
    sh(NODE, f"echo '# hand edit' >> {nccl_conf}")
    out, _ = play(*check)
    lines = decision(out)
    assert not is_noop(out) and any(f"drift: nccl file {nccl_conf}" in x for x in lines), lines
    sh(NODE, f"sed -i '$ d' {nccl_conf}")
    assert is_noop(play(*check)[0])

    # a managed unit that was active at the converge, stopped
    units = json.loads(sh(NODE, "cat /var/lib/lcm/generations/converged.json"))["services"]
    unit = "munge" if "munge" in units else units[0]
    sh(NODE, f"systemctl stop {unit}")
    try:
        lines = decision(play(*check)[0])
        assert any(f"service {unit} is not active" in x for x in lines), lines
    finally:
        sh(NODE, f"systemctl start {unit}")
    assert is_noop(play(*check)[0])

    # different inputs: an extra var (also: the project's files, the inventory, --tags/--limit, LAB_* env)
    lines = decision(play(*check, extra={"slurm_partition_name": "other"})[0])
    assert lines and all("the converge's inputs changed" in x for x in lines), lines

    # the escape hatch: always in full
    lines = decision(play(*check, extra={"lcm_converge_full": True})[0])
    assert lines and all("lcm_converge_full=true" in x for x in lines), lines
