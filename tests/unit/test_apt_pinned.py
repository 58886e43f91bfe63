"""plugins/modules/lcm_apt_pinned.py (roles/_packages' one module run): dpkg-query parsing and the plan on
this machine's real dpkg database, and the module itself through ansible in check mode (nothing installed
here; the lab's converge installs and holds for real and tests/infra checks pins and holds)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from _plugin_modules import load_module
from _role_run import run_role

ROOT = Path(__file__).resolve().parents[2]


apt = load_module("lcm_apt_pinned")


def _installed(name: str) -> str:
    return subprocess.run(
        ["dpkg-query", "-W", "-f=${Version}", name], capture_output=True, text=True, check=True
    ).stdout


def test_query_reads_this_machines_dpkg_and_leaves_unknown_names_out() -> None:
    state = apt.query(["bash", "coreutils", "no-such-package-lcm"])
    assert state["bash"] == apt.Installed(_installed("bash"), state["bash"].selection)
    assert state["bash"].selection in {"install", "hold"}
    assert state["coreutils"].version == _installed("coreutils")
    assert "no-such-package-lcm" not in state


def test_parse_counts_only_the_installed_state_and_prefers_the_installed_architecture() -> None:
    text = (
        "munge\t0.5.15-2\thold ok installed\n"
        "slurmd\t22.05.8-4\tinstall ok config-files\n"
        "libc6\t2.36-9\tinstall ok not-installed\n"
        "libc6\t2.36-9+deb12u10\tinstall ok installed\n"
        "garbage line\n"
    )
    state = apt.parse_dpkg_query(text)
    assert state["munge"] == apt.Installed("0.5.15-2", "hold")
    assert state["slurmd"] == apt.Installed(None, "install")  # only its conffiles are left
    assert state["libc6"] == apt.Installed("2.36-9+deb12u10", "install")
    assert len(state) == 3


def test_plan_installs_what_is_absent_or_off_its_pin_and_holds_what_is_not_held() -> None:
    state = {
        "at-pin-held": apt.Installed("1.0", "hold"),
        "at-pin-free": apt.Installed("1.0", "install"),
        "off-pin-held": apt.Installed("0.9", "hold"),
        "off-pin-free": apt.Installed("1.1", "install"),
    }
    pins = {n: "1.0" for n in [*state, "absent"]}
    todo = apt.plan(pins, state, hold=True)
    assert todo.install == ["absent", "off-pin-free", "off-pin-held"]
    assert todo.unhold == ["off-pin-held"]  # released before apt moves it, held again after
    assert todo.hold == ["absent", "at-pin-free", "off-pin-free", "off-pin-held"]
    assert todo.changes
    nothing = apt.plan({"at-pin-held": "1.0"}, state, hold=True)
    assert not nothing.changes and nothing == apt.Plan()
    # hold=False: a package at its pin is left as it is, held or not
    assert not apt.plan({"at-pin-free": "1.0", "at-pin-held": "1.0"}, state, hold=False).changes
    assert apt.plan({"off-pin-held": "1.0"}, state, hold=False) == apt.Plan(
        ["off-pin-held"], ["off-pin-held"], []
    )


def _role(tmp_path: Path, pins: dict[str, str], hold: bool = True) -> dict[str, Any]:
    """roles/_packages (and so the module) through ansible-playbook on localhost in check mode, with a lock
    of `pins`: the result of its install task."""
    run = run_role(
        "_packages",
        tmp_path,
        {"_packages_names": list(pins), "_packages_hold": hold, "lcm_lock": {"packages": pins}},
        check=True,
    )
    return run.task("Install the pinned packages")


@pytest.mark.parametrize("hold", [False, True])
def test_the_role_in_check_mode_on_this_machine(tmp_path: Path, hold: bool) -> None:
    bash = _installed("bash")
    held = apt.query(["bash"])["bash"].selection == "hold"
    same = _role(tmp_path, {"bash": bash}, hold)
    assert same["installed"] == [] and same["unheld"] == [] and same["before"] == {"bash": bash}
    assert same["held"] == (["bash"] if hold and not held else [])
    assert same["changed"] is (hold and not held)
    other = _role(tmp_path, {"bash": "0.0-lcm-test", "no-such-package-lcm": "1.0"}, hold)
    assert other["changed"] is True
    assert other["installed"] == ["bash=0.0-lcm-test", "no-such-package-lcm=1.0"]
    assert other["before"] == {"bash": bash, "no-such-package-lcm": None}
    # nothing moved: check mode
    assert _installed("bash") == bash


def test_the_module_refuses_an_empty_or_spaced_version(tmp_path: Path) -> None:
    res = _role(tmp_path, {"bash": "1.0 2"})
    assert res.get("failed") and "empty names or versions" in str(res["msg"])
