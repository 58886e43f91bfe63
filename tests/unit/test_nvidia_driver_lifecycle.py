"""roles/nvidia_driver's driver lifecycle (docs/driver-lifecycle.md): the upgrade plan as a pure function,
exhaustively; the module flavour, holders, package holds and Slurm state parsers (with a real H200's
/proc/driver/nvidia/version); and the role's own task files run for real on localhost with ansible-playbook:
preflight refusals, the plan read from a fake /sys/module + /proc + modinfo in tmp, the stop message, and
the Slurm drain/resume against fake scontrol/squeue scripts (delegated to localhost).
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import stat
from pathlib import Path

import pytest
from _role_run import H200_GPU, IB_FABRIC, REPO, lock, run_role, spec

_spec = importlib.util.spec_from_file_location(
    "nvidia_lifecycle", REPO / "roles/nvidia_driver/filter_plugins/nvidia_lifecycle.py"
)
assert _spec and _spec.loader
lc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lc)

FIXTURE = Path(__file__).parent / "fixtures/health/h200-1gpu"
H200_PROC_VERSION = (FIXTURE / "proc-driver-version.txt").read_text()
PROPRIETARY_PROC_VERSION = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.309.01  Tue Jan 13 2026\n"
    "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
)
NEW, OLD = "580.159.04", "570.195.03"
B200_GPU = {"model": "b200", "count_per_node": 8, "gres_type": "b200", "nvswitch": True}


# --- the plan, exhaustively ------------------------------------------------------------------------------

VERSIONS = ["none", OLD, NEW]


@pytest.mark.parametrize(
    ("loaded", "installed", "reboot_allowed", "holders", "rebooted"),
    list(
        itertools.product(
            VERSIONS, VERSIONS, [False, True], [[], ["pid 7 (python3) has /dev/nvidia0 open"]], [False, True]
        )
    ),
)
def test_plan_every_state(loaded, installed, reboot_allowed, holders, rebooted):
    """Every (loaded, installed) x reboot policy x holders x rebooted: the one action the rules give."""
    plan = lc.upgrade_plan(loaded, installed, NEW, reboot_allowed, holders, rebooted)
    assert plan["action"] in lc.ACTIONS and plan["reason"]
    if installed != NEW:
        expect = "install"
    elif loaded == "none":
        expect = "load"
    elif loaded == installed:
        expect = "none"
    elif rebooted:
        expect = "stop"  # never a second reboot
    elif not holders:
        expect = "reload"
    else:
        expect = "reboot" if reboot_allowed else "stop"
    assert plan["action"] == expect, plan
    # Draining and stopping services is for a driver that is there and changes (or must be reloaded).
    assert plan["disruptive"] == (
        expect in ("reload", "reboot", "stop")
        or (expect == "install" and (loaded, installed) != ("none", "none"))
    )
    assert not (plan["action"] == "reboot" and (rebooted or not reboot_allowed))


def test_plan_reasons_name_the_versions_and_what_to_do():
    assert lc.upgrade_plan(NEW, NEW, NEW) == {
        "action": "none",
        "reason": f"loaded = installed = {NEW}: no reboot",
        "disruptive": False,
    }
    assert (
        lc.upgrade_plan("none", "none", NEW)["reason"]
        == f"installed no driver, the lock says {NEW}: install it"
    )
    assert (
        lc.upgrade_plan(OLD, OLD, NEW)["reason"]
        == f"installed {OLD}, the lock says {NEW}: replace the driver"
    )
    stop = lc.upgrade_plan(OLD, NEW, NEW, False, ["pid 7 (python3) has /dev/nvidia0 open"])
    assert stop["action"] == "stop"
    assert stop["reason"].startswith(
        f"loaded {OLD}, installed {NEW}; held by pid 7 (python3) has /dev/nvidia0 open; "
        "a reboot is not allowed (nvidia_driver_reboot_allowed=false)"
    )
    assert "-e nvidia_driver_reboot_allowed=true" in stop["reason"]
    assert "no second reboot" in lc.upgrade_plan(OLD, NEW, NEW, True, ["x"], rebooted=True)["reason"]


@pytest.mark.parametrize(
    ("loaded_f", "installed_f", "wanted_f", "action"),
    [
        ("open", "open", "open", "none"),
        ("", "", "open", "none"),  # flavours unknown: versions decide
        ("proprietary", "proprietary", "open", "install"),  # flavour change = a driver change
        ("proprietary", "open", "open", "reload"),  # new flavour installed, old one still loaded
        ("open", "proprietary", "proprietary", "reload"),
    ],
)
def test_plan_counts_the_flavour_like_a_version(loaded_f, installed_f, wanted_f, action):
    plan = lc.upgrade_plan(NEW, NEW, NEW, False, [], False, loaded_f, installed_f, wanted_f)
    assert plan["action"] == action, plan
    if action == "install":
        assert plan["reason"] == (
            f"installed {NEW} has the proprietary kernel modules, nvidia_driver_kernel_module is open: "
            "replace the driver"
        )


def test_plan_normalises_empty_values():
    assert lc.upgrade_plan("", None, NEW)["action"] == "install"
    assert lc.upgrade_plan(" 580.159.04\n", "580.159.04", NEW)["action"] == "none"


# --- parsers --------------------------------------------------------------------------------------------


def test_module_flavour_of_a_real_h200_and_of_the_proprietary_modules():
    assert H200_PROC_VERSION.startswith("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04")
    assert lc.module_flavour(H200_PROC_VERSION) == "open"
    assert lc.module_flavour(PROPRIETARY_PROC_VERSION) == "proprietary"
    assert lc.module_flavour("") == "none"


def test_modinfo_fields():
    open_mod = (
        "filename: /lib/modules/6.1.0-28-amd64/updates/dkms/nvidia.ko\n"
        "license:        Dual MIT/GPL\nversion:        580.159.04\n"
    )
    assert lc.modinfo_fields(open_mod) == {"version": NEW, "flavour": "open"}
    assert lc.modinfo_fields("version: 535.309.01\nlicense: NVIDIA\n") == {
        "version": "535.309.01",
        "flavour": "proprietary",
    }
    assert lc.modinfo_fields("") == {"version": "none", "flavour": ""}


def test_module_holders():
    lines = [
        "loaded 570.195.03",
        "module nvidia_uvm 0 ",
        "module nvidia_modeset 0 ",
        "module nvidia 2 nvidia_uvm,nvidia_modeset",  # held only by our own modules: unloadable
    ]
    assert lc.module_holders(lines) == []
    lines[1] = "module nvidia_uvm 3 "  # three open handles (CUDA processes)
    lines.append("module nvidia_drm 1 some_gpu_kms")
    lines.append("proc 4242 python3 /dev/nvidia0")
    assert lc.module_holders(lines) == [
        "nvidia_uvm in use (3 references beyond its holder modules)",
        "module some_gpu_kms (uses nvidia_drm)",
        "pid 4242 (python3) has /dev/nvidia0 open",
    ]


def test_held_drift_names_package_held_version_and_lock():
    lines = [
        "nvidia-driver 535.247.01-1~deb12u1 hold",
        "nvidia-smi 535.309.01-0+deb12u1 install",
        "nvidia-fabricmanager-580 580.159.04-1 hold",
        "nvidia-open-kernel-dkms 535.216.01-1~deb12u1 install",
    ]
    wanted = {
        "nvidia-driver": "535.309.01-0+deb12u1",
        "nvidia-smi": "535.309.01-0+deb12u1",
        "nvidia-fabricmanager-580": "580.159.04-1",
        "nvidia-open-kernel-dkms": "535.309.01-0+deb12u1",
        "firmware-nvidia-gsp": "535.309.01-0+deb12u1",
    }
    assert lc.held_drift(lines, wanted) == [
        "nvidia-driver is held at 535.247.01-1~deb12u1, the lock says 535.309.01-0+deb12u1",
        "nvidia-smi 535.309.01-0+deb12u1 is not held",
        "nvidia-open-kernel-dkms is at 535.216.01-1~deb12u1 (not held), the lock says 535.309.01-0+deb12u1",
        "firmware-nvidia-gsp is not installed (the lock says 535.309.01-0+deb12u1)",
    ]


SHOW_NODE = """NodeName=gpu01 Arch=x86_64 CoresPerSocket=56
   CPUAlloc=0 CPUEfctv=224 CPUTot=224 CPULoad=0.12
   State={state} ThreadsPerCore=2 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A
   Partitions=gpu
   Reason={reason}
"""


def test_slurm_node_and_drain_ownership():
    ours = SHOW_NODE.format(
        state="IDLE+DRAIN", reason=f"lcm: driver upgrade {OLD} -> {NEW} [root@2026-12-01T10:00:00]"
    )
    node = lc.slurm_node(ours)
    assert node == {
        "found": True,
        "state": "IDLE+DRAIN",
        "drain": True,
        "reason": f"lcm: driver upgrade {OLD} -> {NEW}",
    }
    assert lc.owns_drain(node, NEW)
    assert not lc.owns_drain(node, "580.159.05"), "an upgrade to another version is not this one"
    other = lc.slurm_node(
        SHOW_NODE.format(state="MIXED+DRAIN", reason="bad DIMM, ticket 4711 [admin@2026-11-30T09:00:00]")
    )
    assert other["reason"] == "bad DIMM, ticket 4711" and not lc.owns_drain(other, NEW)
    idle = lc.slurm_node(SHOW_NODE.replace("   Reason={reason}\n", "").format(state="IDLE"))
    assert idle == {"found": True, "state": "IDLE", "drain": False, "reason": ""}
    assert not lc.owns_drain(idle, NEW)
    assert lc.slurm_node("")["found"] is False
    assert lc.drain_reason(OLD, NEW) == f"lcm: driver upgrade {OLD} -> {NEW}"


# --- the role's task files, for real --------------------------------------------------------------------


def _msgs(run) -> list[str]:
    """The failure messages, whitespace as one space (a folded YAML fail_msg keeps some line breaks)."""
    return [" ".join(m.split()) for m in run.failed_msgs]


def _exe(path: Path, body: str) -> str:
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def _node(
    tmp_path: Path, loaded: str | None, installed: str | None, flavour: str = "open", users: int = 0
) -> dict:
    """A fake /sys/module, /proc (users: processes with /dev/nvidia0 open) and modinfo, as role variables."""
    sysm, proc = tmp_path / "sys-module", tmp_path / "proc"
    sysm.mkdir()
    proc.mkdir()
    if loaded:
        for m, holders in (
            ("nvidia", ["nvidia_uvm", "nvidia_modeset"]),
            ("nvidia_uvm", []),
            ("nvidia_modeset", []),
        ):
            (sysm / m / "holders").mkdir(parents=True)
            for h in holders:
                (sysm / m / "holders" / h).mkdir()
            refcnt = len(holders) + (users if m == "nvidia_uvm" else 0)
            (sysm / m / "refcnt").write_text(f"{refcnt}\n")
        (sysm / "nvidia" / "version").write_text(loaded + "\n")
    for i in range(users):
        p = proc / str(4242 + i)
        (p / "fd").mkdir(parents=True)
        (p / "comm").write_text("python3\n")
        (p / "fd" / "3").symlink_to("/dev/nvidia0")
    lic = "Dual MIT/GPL" if flavour == "open" else "NVIDIA"
    body = (
        f'printf "version:        {installed}\\nlicense:        {lic}\\n"\n'
        if installed
        else 'echo "modinfo: ERROR: Module nvidia not found." >&2; exit 1\n'
    )
    procver = tmp_path / "proc-driver-version"
    if loaded:
        procver.write_text(
            H200_PROC_VERSION.replace(NEW, loaded) if flavour == "open" else PROPRIETARY_PROC_VERSION
        )
    return {
        "_nvidia_driver_sysfs_module": str(sysm),
        "_nvidia_driver_proc": str(proc),
        "_nvidia_driver_modinfo": [_exe(tmp_path / "modinfo", body)],
        "_nvidia_driver_proc_version": str(procver),
    }


def _h200(**over):
    return {"cluster": spec(gpu=H200_GPU, fabric=IB_FABRIC)} | over


def test_preflight_refuses_proprietary_modules_on_blackwell(tmp_path):
    run = run_role(
        "nvidia_driver",
        tmp_path,
        {"cluster": spec(gpu=B200_GPU, fabric=IB_FABRIC), "nvidia_driver_kernel_module": "proprietary"},
        tags="nvidia_driver_preflight",
    )
    assert run.rc != 0
    (msg,) = _msgs(run)
    assert msg.startswith(
        "nvidia_driver_kernel_module=proprietary: cluster.gpu.model is b200: Blackwell GPUs run only"
    )
    assert "set nvidia_driver_kernel_module: open" in msg


def test_preflight_says_when_the_lock_has_no_open_module_package_for_the_debian_driver(tmp_path):
    lk = lock()
    del lk["packages"]["nvidia-open-kernel-dkms"]
    run = run_role(
        "nvidia_driver",
        tmp_path,
        _h200(nvidia_driver_source="debian", lcm_lock=lk),
        tags="nvidia_driver_preflight",
    )
    assert run.rc != 0
    (msg,) = _msgs(run)
    assert msg.startswith(
        "nvidia_driver_kernel_module=open with nvidia_driver_source=debian installs nvidia-open-kernel-dkms, "
        "which must be pinned at the driver's version 535.309.01 (lcm_lock.packages.nvidia-driver); "
        "the lock has no entry"
    )
    assert "Debian 12 ships the open modules of the 535 branch as nvidia-open-kernel-dkms in contrib" in msg
    lk["packages"]["nvidia-open-kernel-dkms"] = "535.216.01-1~deb12u1"
    run = run_role(
        "nvidia_driver",
        tmp_path,
        _h200(nvidia_driver_source="debian", lcm_lock=lk),
        tags="nvidia_driver_preflight",
    )
    assert "the lock has lcm_lock.packages.nvidia-open-kernel-dkms = 535.216.01-1~deb12u1" in _msgs(run)[0]


def _sysfs_hgx(tmp_path: Path) -> str:
    root = tmp_path / "pci"
    for i, klass in enumerate(["0x030200"] * 8 + ["0x068000"] * 4):
        d = root / f"0000:{i + 0x10:02x}:00.0"
        d.mkdir(parents=True)
        (d / "vendor").write_text("0x10de\n")
        (d / "class").write_text(klass + "\n")
    return str(root)


@pytest.mark.parametrize(
    ("loaded", "installed", "flavour", "users", "reboot", "action", "disruptive"),
    [
        (None, None, "open", 0, False, "install", False),  # a new node
        (OLD, OLD, "open", 0, False, "install", True),  # the upgrade: drain, stop services, replace
        (NEW, NEW, "open", 0, False, "none", False),  # converged: nothing, no reboot
        (NEW, NEW, "proprietary", 0, False, "install", True),  # flavour change
        (OLD, NEW, "open", 0, False, "reload", True),  # installed, old one loaded, nothing holds it
        (OLD, NEW, "open", 2, False, "stop", True),  # ... held by two processes, no reboot allowed
        (OLD, NEW, "open", 2, True, "reboot", True),
    ],
)
def test_preflight_plans_from_the_nodes_sysfs_and_modinfo(
    tmp_path, loaded, installed, flavour, users, reboot, action, disruptive
):
    node = _node(tmp_path, loaded, installed, flavour, users)
    run = run_role(
        "nvidia_driver",
        tmp_path,
        _h200(_nvidia_driver_sysfs_pci=_sysfs_hgx(tmp_path), nvidia_driver_reboot_allowed=reboot) | node,
        tags="nvidia_driver_preflight",
    )
    assert run.rc == 0, run.failed_msgs or run.stderr[-2000:]
    facts = run.task("Set the driver state and the plan")["ansible_facts"]
    plan = facts["_nvidia_driver_plan"]
    assert (plan["action"], plan["disruptive"]) == (action, disruptive), plan
    assert facts["_nvidia_driver_loaded"] == (loaded or "none")
    assert facts["_nvidia_driver_installed"] == (installed or "none")
    if users:
        assert facts["_nvidia_driver_holders"] == [
            "nvidia_uvm in use (2 references beyond its holder modules)",
            "pid 4242 (python3) has /dev/nvidia0 open",
            "pid 4243 (python3) has /dev/nvidia0 open",
        ]
    shown = run.task("Show the driver plan")["msg"]
    assert (
        shown.startswith(f"localhost: driver {action} (")
        and "wanted 580.159.04 open (lcm_lock.artifacts.nvidia_driver)" in shown
    )


def test_activate_stops_with_the_exact_state_when_a_reboot_is_not_allowed(tmp_path):
    node = _node(tmp_path, OLD, NEW, "open", users=1)
    run = run_role("nvidia_driver", tmp_path, _h200() | node, tasks_from="activate")
    assert run.rc != 0
    (msg,) = _msgs(run)
    assert msg.startswith(
        f"localhost: NVIDIA driver not activated: loaded {OLD} (open), installed {NEW} (open); held by "
    )
    assert f"Loaded {OLD}, installed {NEW}, wanted {NEW} (lcm_lock.artifacts.nvidia_driver);" in msg
    assert (
        "holders: nvidia_uvm in use (1 references beyond its holder modules); "
        "pid 4242 (python3) has /dev/nvidia0 open." in msg
    )
    assert (
        "Run: ansible-playbook playbooks/validate.yml playbooks/gpu.yml --limit localhost "
        "-e nvidia_driver_reboot_allowed=true" in msg
    )
    # Nothing was unloaded, loaded or rebooted.
    assert not [
        r
        for r in run.results
        if r["task"].startswith(("Unload", "Load", "Reboot")) and not r["result"].get("skipped")
    ]


def test_activate_does_not_reboot_twice_in_one_converge(tmp_path):
    node = _node(tmp_path, OLD, NEW, "open", users=1)
    run = run_role(
        "nvidia_driver",
        tmp_path,
        _h200(nvidia_driver_reboot_allowed=True, _nvidia_driver_rebooted=True) | node,
        tasks_from="activate",
    )
    assert run.rc != 0
    assert "after this converge's reboot" in _msgs(run)[0] and "no second reboot" in _msgs(run)[0]
    assert run.task("Reboot the node").get("skipped")


def test_activate_with_the_driver_converged_changes_nothing(tmp_path):
    run = run_role("nvidia_driver", tmp_path, _h200() | _node(tmp_path, NEW, NEW), tasks_from="activate")
    assert run.rc == 0, run.failed_msgs
    assert run.changed == 0


# --- Slurm drain and resume, against fake scontrol/squeue on "the controller" (localhost) ---------------


def _slurm(tmp_path: Path, state: str, reason: str = "", jobs: str = "") -> dict:
    """scontrol: `show node` prints the node from files; `update` logs its argv and changes them."""
    d = tmp_path / "slurm"
    d.mkdir()
    (d / "state").write_text(state)
    (d / "reason").write_text(reason)
    (d / "jobs").write_text(jobs)
    scontrol = _exe(
        d / "scontrol",
        f"""D={d}
if [ "$1" = show ]; then
  printf 'NodeName=%s Arch=x86_64\\n   State=%s ThreadsPerCore=2\\n' "$3" "$(cat $D/state)"
  [ -s $D/reason ] && printf '   Reason=%s [root@2026-12-01T10:00:00]\\n' "$(cat $D/reason)"
  exit 0
fi
printf '%s\\n' "$*" >> $D/log
for a in "$@"; do
  case "$a" in
    State=DRAIN) echo IDLE+DRAIN > $D/state ;;
    State=RESUME) echo IDLE > $D/state; : > $D/reason ;;
    Reason=*) printf '%s' "${{a#Reason=}}" > $D/reason ;;
  esac
done
""",
    )
    squeue = _exe(d / "squeue", f'printf "%s" "$(cat {d}/jobs)"\nprintf \'%s\\n\' "$*" >> {d}/squeue.log\n')
    return {
        "_nvidia_driver_slurm_controller": "localhost",
        "_nvidia_driver_scontrol": [scontrol],
        "_nvidia_driver_squeue": [squeue],
        "_nvidia_driver_slurm_name": "gpu01",
        "_nvidia_driver_drain_poll_s": 1,
        "nvidia_driver_drain_timeout_s": 2,
        "_nvidia_driver_loaded": OLD,
        "_nvidia_driver_installed": OLD,
    }


def _log(tmp_path: Path) -> list[str]:
    f = tmp_path / "slurm" / "log"
    return f.read_text().splitlines() if f.exists() else []


def test_drain_then_resume_a_node_this_role_drained(tmp_path):
    v = _h200() | _slurm(tmp_path, "IDLE")
    run = run_role("nvidia_driver", tmp_path, v, tasks_from="slurm_drain")
    assert run.rc == 0, run.failed_msgs or run.stderr[-2000:]
    assert _log(tmp_path) == [f"update NodeName=gpu01 State=DRAIN Reason=lcm: driver upgrade {OLD} -> {NEW}"]
    assert (tmp_path / "slurm/squeue.log").read_text().split() == [
        "--noheader",
        "--nodelist=gpu01",
        "--states=RUNNING,COMPLETING,SUSPENDED",
        "--format=%A",
    ]
    run = run_role("nvidia_driver", tmp_path, v, tasks_from="slurm_resume")
    assert run.rc == 0, run.failed_msgs
    assert _log(tmp_path)[-1] == "update NodeName=gpu01 State=RESUME"


def test_a_node_drained_by_someone_else_is_neither_redrained_nor_resumed(tmp_path):
    v = _h200() | _slurm(tmp_path, "IDLE+DRAIN", "bad DIMM, ticket 4711")
    run = run_role("nvidia_driver", tmp_path, v, tasks_from="slurm_drain")
    assert run.rc == 0, run.failed_msgs
    assert (
        'was already drained (State=IDLE+DRAIN Reason="bad DIMM, ticket 4711")'
        in run.task("drained by someone else")["msg"]
    )
    run = run_role("nvidia_driver", tmp_path, v, tasks_from="slurm_resume")
    assert run.rc == 0
    assert _log(tmp_path) == [], "no scontrol update at all"
    assert 'stays drained (Reason="bad DIMM, ticket 4711": not this role' in run.task("stays drained")["msg"]


def test_drain_times_out_with_the_job_ids(tmp_path):
    v = _h200() | _slurm(tmp_path, "MIXED", jobs="4711\n4712\n")
    run = run_role("nvidia_driver", tmp_path, v, tasks_from="slurm_drain")
    assert run.rc != 0
    (msg,) = _msgs(run)
    assert msg.startswith(
        "localhost: Slurm node gpu01 still runs job(s) 4711, 4712 after 2 s (nvidia_driver_drain_timeout_s)"
    )
    assert f'The node stays drained (Reason="lcm: driver upgrade {OLD} -> {NEW}")' in msg
    assert "scontrol update NodeName=gpu01 State=RESUME" in msg


def test_without_a_controller_group_there_is_no_drain(tmp_path):
    run = run_role(
        "nvidia_driver",
        tmp_path,
        _h200(_nvidia_driver_loaded=OLD, _nvidia_driver_installed=OLD),
        tasks_from="slurm_drain",
    )
    assert run.rc == 0, run.failed_msgs
    assert (
        "no Slurm node to drain (no controller group in the inventory)"
        in run.task("Slurm is not there")["msg"]
    )


# --- verify: the loaded flavour and the package holds ----------------------------------------------------


@pytest.mark.skipif(Path("/dev/nvidia0").exists(), reason="this machine has GPUs (test_nvidia_gpu_host.py)")
def test_verify_names_a_flavour_and_a_held_package_that_differ(tmp_path):
    v = {
        "cluster": spec(gpu=H200_GPU | {"count_per_node": 1, "nvswitch": False}),
        "_nvidia_driver_proc_version": str(FIXTURE / "proc-driver-version.txt"),
        "nvidia_driver_kernel_module": "proprietary",
        "_nvidia_driver_held": {"bash": "0.0-1", "lcm-no-such-package": "1.0-1"},
    }
    run = run_role("nvidia_driver", tmp_path, v, tasks_from="verify")
    assert run.rc != 0
    (msg,) = _msgs(run)
    assert "the loaded kernel module is open, nvidia_driver_kernel_module is proprietary" in msg
    assert "lcm-no-such-package is not installed (the lock says 1.0-1)" in msg
    bash = json.dumps(run.task("Set the packages that differ")["ansible_facts"]["_nvidia_driver_held_drift"])
    assert "bash is at " in bash and "(not held), the lock says 0.0-1" in bash
    run = run_role(
        "nvidia_driver", tmp_path, v | {"nvidia_driver_kernel_module": "open"}, tasks_from="verify"
    )
    assert "kernel module is" not in _msgs(run)[0]
