"""plugins/modules/lcm_unit_states.py (roles/slurm, roles/pyxis, roles/nvidia_driver read the named units'
states with it instead of service_facts): `systemctl show` parsing, on output captured from a lab node
(Debian 12's systemd 252), and the module itself through ansible with a `systemctl` on PATH that prints it.
The lab's converge runs it against the nodes' real systemd (slurmd/slurmctld stopped or started by it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _plugin_modules import load_module

ROOT = Path(__file__).resolve().parents[2]


us = load_module("lcm_unit_states")

# `systemctl show --property=Id,LoadState,ActiveState,UnitFileState -- nope.service ssh.service
# systemd-journald.service` on a lab node container
SHOW = """Id=nope.service
LoadState=not-found
ActiveState=inactive
UnitFileState=

Id=ssh.service
LoadState=loaded
ActiveState=failed
UnitFileState=enabled

Id=systemd-journald.service
LoadState=loaded
ActiveState=active
UnitFileState=static
"""
NAMES = ["nope.service", "ssh.service", "systemd-journald.service"]


def test_parse_maps_each_block_to_the_unit_asked_in_order() -> None:
    units = us.parse_show(SHOW, NAMES)
    assert units["nope.service"] == {
        "exists": False,
        "load": "not-found",
        "active": "inactive",
        "enabled": "",
    }
    assert units["ssh.service"] == {
        "exists": True,
        "load": "loaded",
        "active": "failed",
        "enabled": "enabled",
    }
    assert units["systemd-journald.service"]["active"] == "active"
    assert units["systemd-journald.service"]["enabled"] == "static"


def test_a_block_count_that_does_not_match_the_names_is_an_error() -> None:
    with pytest.raises(ValueError, match="2 blocks for 3 units"):
        us.parse_show(SHOW.split("\n\nId=systemd-journald")[0], NAMES)
    with pytest.raises(ValueError, match="0 blocks for 1 units"):
        us.parse_show("", ["slurmd.service"])


@pytest.mark.parametrize(
    ("given", "unit"),
    [("slurmd", "slurmd.service"), ("slurmd.service", "slurmd.service"), ("munge.socket", "munge.socket"),
     ("lcm-node-watchdog", "lcm-node-watchdog.service"), ("nvidia-dcgm", "nvidia-dcgm.service")],
)  # fmt: skip
def test_names_without_a_unit_suffix_are_services(given: str, unit: str) -> None:
    assert us.unit_name(given) == unit


def _fake_systemctl(tmp_path: Path, out: str, rc: int = 0) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "out.txt").write_text(out)
    script = bin_dir / "systemctl"
    script.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/argv\ncat {tmp_path}/out.txt\nexit {rc}\n')
    script.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def _adhoc(tmp_path: Path, env: dict[str, str], names: str) -> dict:
    cfg = tmp_path / "ansible.cfg"
    cfg.write_text(f"[defaults]\nlibrary = {ROOT / 'plugins/modules'}\n")
    p = subprocess.run(
        ["ansible", "localhost", "-c", "local", "-e", f"ansible_python_interpreter={sys.executable}",
         "-m", "lcm_unit_states", "-a", f"names={names}", "--check", "-o"],
        capture_output=True, text=True, env={**env, "ANSIBLE_CONFIG": str(cfg)}, cwd=tmp_path, check=False,
    )  # fmt: skip
    line = next((x for x in p.stdout.splitlines() if x.startswith("localhost |")), None)
    assert line, p.stdout + p.stderr
    return {"ok": " | SUCCESS => " in line, **json.loads(line.split("=> ", 1)[1])}


def test_the_module_asks_systemd_once_for_the_named_units_and_runs_in_check_mode(tmp_path: Path) -> None:
    res = _adhoc(tmp_path, _fake_systemctl(tmp_path, SHOW), "nope,ssh,systemd-journald")
    assert res["ok"] and res["changed"] is False
    assert res["units"]["ssh.service"]["exists"] and not res["units"]["nope.service"]["exists"]
    calls = (tmp_path / "argv").read_text().splitlines()
    assert len(calls) == 1, "one systemctl call for the three units"
    assert calls[0].split() == ["show", "--property=Id,LoadState,ActiveState,UnitFileState", "--", *NAMES]


def test_the_module_fails_naming_systemctls_error(tmp_path: Path) -> None:
    res = _adhoc(tmp_path, _fake_systemctl(tmp_path, "", rc=1), "slurmd")
    assert not res["ok"] and "exited 1" in res["msg"]


def test_the_driver_role_stops_only_the_gpu_services_present(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """roles/nvidia_driver/tasks/stop_services.yml before a driver change: the present GPU services, from
    lcm_unit_states (a fake systemctl: nvidia-dcgm and nvidia-persistenced present, the other two not)."""
    from _role_run import run_role

    units = [
        ("dcgm-exporter", "not-found", "inactive", ""),
        ("nvidia-dcgm", "loaded", "active", "enabled"),
        ("nvidia-fabricmanager", "not-found", "inactive", ""),
        ("nvidia-persistenced", "loaded", "active", "enabled"),
    ]
    show = "\n\n".join(
        f"Id={u}.service\nLoadState={s}\nActiveState={a}\nUnitFileState={e}" for u, s, a, e in units
    )
    env = _fake_systemctl(tmp_path, show + "\n")
    monkeypatch.setenv("PATH", env["PATH"])
    run = run_role("nvidia_driver", tmp_path, {}, tasks_from="stop_services", check=True)
    facts = run.task("Set the GPU services to stop")["ansible_facts"]
    assert facts["_nvidia_driver_stopped"] == ["nvidia-dcgm", "nvidia-persistenced"]
    first = (tmp_path / "argv").read_text().splitlines()[0].split()
    assert first == ["show", "--property=Id,LoadState,ActiveState,UnitFileState", "--"] + [
        f"{u}.service"
        for u in ("dcgm-exporter", "nvidia-dcgm", "nvidia-fabricmanager", "nvidia-persistenced")
    ]
