"""Filters of roles/nvidia_driver's driver lifecycle: what a converge must do to bring the node from the
driver it runs to the locked one (install, load, reload the modules, reboot, or stop and say why), the kernel
module flavour, package holds, and the Slurm node state of an upgrade's drain.

Pure functions of what the role reads on the node (/sys/module/nvidia/version, `modinfo nvidia`,
/proc/driver/nvidia/version, /sys/module/<m>/{refcnt,holders}, /proc/<pid>/fd, dpkg-query, scontrol):
unit-tested in tests/unit/test_nvidia_driver_lifecycle.py. docs/driver-lifecycle.md has the procedure.
"""

from __future__ import annotations

import re
from typing import Any

# The driver's modules, in the order they unload (each holds the ones after it; nvidia_peermem holds
# nvidia for GPUDirect RDMA).
MODULES = ("nvidia_peermem", "nvidia_uvm", "nvidia_drm", "nvidia_modeset", "nvidia")
NONE = "none"
# Actions of upgrade_plan.
ACTIONS = ("none", "install", "load", "reload", "reboot", "stop")
DRAIN_REASON = "lcm: driver upgrade"


def _v(version: Any) -> str:
    v = str(version if version is not None else "").strip()
    return v or NONE


def upgrade_plan(
    loaded: Any,
    installed: Any,
    wanted: Any,
    reboot_allowed: bool = False,
    holders: list[str] | None = None,
    rebooted: bool = False,
    loaded_flavour: str = "",
    installed_flavour: str = "",
    wanted_flavour: str = "",
) -> dict[str, Any]:
    """The next step from the loaded driver (/sys/module/nvidia/version, 'none' when not loaded) and the
    installed one (`modinfo nvidia` of the running kernel, 'none' when absent) to the wanted (locked) one.

    {"action": one of ACTIONS, "reason": one line, "disruptive": the step stops GPU work on the node
    (drain it in Slurm and stop the services first)}:
      install  the installed driver (version or flavour) is not the wanted one: replace it first
      none     loaded = installed = wanted: nothing to do, no reboot
      load     installed = wanted, nothing loaded: modprobe (a first install)
      reload   loaded != installed, nothing holds the modules: unload and load them
      reboot   something holds them and nvidia_driver_reboot_allowed: the one reboot of this converge
      stop     something holds them and a reboot is not allowed (or this converge rebooted already): the
               play stops and the reason says the exact state and what to run
    The flavours ('open'/'proprietary', '' = unknown, not compared) count like versions.
    """
    loaded, installed, wanted = _v(loaded), _v(installed), _v(wanted)
    holders = [str(h) for h in holders or []]
    lf, inf, wf = (str(f or "").strip() for f in (loaded_flavour, installed_flavour, wanted_flavour))
    flavour_differs = bool(inf and wf and inf != wf)
    present = loaded != NONE or installed != NONE
    if installed != wanted or flavour_differs:
        what = installed if installed != NONE else "no driver"
        if flavour_differs and installed == wanted:
            why = f"installed {installed} has the {inf} kernel modules, nvidia_driver_kernel_module is {wf}"
        else:
            why = (
                f"installed {what}{f' ({inf})' if inf and installed != NONE else ''}, the lock says {wanted}"
            )
        return {
            "action": "install",
            "reason": f"{why}: replace the driver" if present else f"{why}: install it",
            "disruptive": present,
        }
    if loaded == NONE:
        return {
            "action": "load",
            "reason": f"{installed} installed, no nvidia module loaded",
            "disruptive": False,
        }
    module_differs = loaded != installed or bool(lf and inf and lf != inf)
    if not module_differs:
        return {"action": "none", "reason": f"loaded = installed = {wanted}: no reboot", "disruptive": False}
    state = f"loaded {loaded}{f' ({lf})' if lf else ''}, installed {installed}{f' ({inf})' if inf else ''}"
    if rebooted:
        return {
            "action": "stop",
            "reason": f"{state} after this converge's reboot: the node booted the old module (check that "
            "DKMS built it for the running kernel: dkms status; modinfo -F version nvidia); no second reboot",
            "disruptive": True,
        }
    if not holders:
        return {
            "action": "reload",
            "reason": f"{state}, nothing holds the modules: reload them",
            "disruptive": True,
        }
    held = "; ".join(holders)
    if reboot_allowed:
        return {"action": "reboot", "reason": f"{state}, held by {held}: reboot", "disruptive": True}
    return {
        "action": "stop",
        "reason": f"{state}; held by {held}; a reboot is not allowed (nvidia_driver_reboot_allowed=false): "
        "stop what holds the modules and rerun, or rerun with -e nvidia_driver_reboot_allowed=true, "
        "or reboot the node yourself and rerun",
        "disruptive": True,
    }


def modinfo_fields(text: str) -> dict[str, str]:
    """`modinfo nvidia` -> {"version", "flavour"} ('none' / '' when there is no module). The open modules are
    dual MIT/GPL licensed, the proprietary ones 'NVIDIA'."""
    fields: dict[str, str] = {}
    for line in str(text or "").splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("version", "license") and key.strip() not in fields:
            fields[key.strip()] = value.strip()
    lic = fields.get("license", "")
    flavour = "" if not lic else ("open" if "GPL" in lic else "proprietary")
    return {"version": fields.get("version") or NONE, "flavour": flavour}


def module_flavour(proc_version: str) -> str:
    """/proc/driver/nvidia/version -> 'open' ('NVIDIA UNIX Open Kernel Module ...'), 'proprietary'
    ('NVIDIA UNIX x86_64 Kernel Module ...') or 'none' (no driver loaded)."""
    first = next((ln for ln in str(proc_version or "").splitlines() if ln.startswith("NVRM version:")), "")
    if "Open Kernel Module" in first:
        return "open"
    if "Kernel Module" in first:
        return "proprietary"
    return NONE


def module_holders(lines: list[str], ours: list[str] | tuple[str, ...] = MODULES) -> list[str]:
    """What keeps the driver's modules from unloading, from lines the role's shell writes:
    'module <name> <refcnt> <holder,holder>' (/sys/module/<name>/{refcnt,holders}) and
    'proc <pid> <comm> <path>' (a process with a /dev/nvidia* file open).

    A holder module outside `ours` holds them; so does any reference a holder module does not explain
    (an open device file, a kernel user).
    """
    out: list[str] = []
    for line in lines or []:
        parts = str(line).split()
        if len(parts) >= 3 and parts[0] == "module":
            name, refcnt = parts[1], int(parts[2]) if parts[2].isdigit() else 0
            holders = [h for h in (parts[3].split(",") if len(parts) > 3 else []) if h]
            foreign = [h for h in holders if h not in ours]
            if foreign:
                out.append(f"module {', '.join(foreign)} (uses {name})")
            if refcnt > len(holders):
                out.append(f"{name} in use ({refcnt - len(holders)} references beyond its holder modules)")
        elif len(parts) >= 4 and parts[0] == "proc":
            out.append(f"pid {parts[1]} ({parts[2]}) has {parts[3]} open")
    return out


def held_drift(lines: list[str], wanted: dict[str, str]) -> list[str]:
    """`dpkg-query -W -f='${Package} ${Version} ${db:Status-Want}\\n' <names>` against the lock's versions:
    each held package at another version, each package not held, each one missing (one line each)."""
    seen: dict[str, tuple[str, str]] = {}
    for line in lines or []:
        parts = str(line).split()
        if len(parts) >= 3:
            seen[parts[0]] = (parts[1], parts[2])
    out: list[str] = []
    for name, version in wanted.items():
        if name not in seen or not seen[name][0]:
            out.append(f"{name} is not installed (the lock says {version})")
            continue
        have, want = seen[name]
        if want == "hold" and have != version:
            out.append(f"{name} is held at {have}, the lock says {version}")
        elif have != version:
            out.append(f"{name} is at {have} (not held), the lock says {version}")
        elif want != "hold":
            out.append(f"{name} {have} is not held")
    return out


def slurm_node(text: str) -> dict[str, Any]:
    """`scontrol show node <node>` -> {"found", "state", "drain", "reason"}; the reason without the
    ' [user@time]' scontrol appends."""
    text = str(text or "")
    state = re.search(r"\bState=(\S+)", text)
    reason = re.search(r"\bReason=(.*)$", text, re.M)
    why = re.sub(r"\s*\[[^\]]*@[^\]]*\]\s*$", "", reason.group(1)).strip() if reason else ""
    st = state.group(1) if state else ""
    return {"found": bool(state), "state": st, "drain": "DRAIN" in st, "reason": "" if why == "none" else why}


def drain_reason(old: Any, new: Any) -> str:
    return f"{DRAIN_REASON} {_v(old)} -> {_v(new)}"


def owns_drain(node: dict[str, Any], wanted: Any) -> bool:
    """The node is drained by this role for an upgrade to `wanted` (this run's or an earlier, stopped one)."""
    pat = rf"^{re.escape(DRAIN_REASON)} \S+ -> {re.escape(_v(wanted))}$"
    return bool(node.get("drain")) and re.match(pat, str(node.get("reason", ""))) is not None


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "nvidia_driver_upgrade_plan": upgrade_plan,
            "nvidia_modinfo_fields": modinfo_fields,
            "nvidia_module_flavour": module_flavour,
            "nvidia_module_holders": module_holders,
            "nvidia_held_drift": held_drift,
            "nvidia_slurm_node": slurm_node,
            "nvidia_drain_reason": drain_reason,
            "nvidia_owns_drain": owns_drain,
        }
