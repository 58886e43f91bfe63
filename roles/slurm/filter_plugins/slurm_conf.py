"""Filters for the slurm role: decide whether a slurm.conf change needs a daemon restart.

`scontrol reconfigure` re-reads most of slurm.conf, but some keys (ports, plugin types, the node
definitions, the controller host...) only take effect when the daemons restart. The role renders
the new file, compares it with the installed one through `slurm_restart_keys_changed` and notifies
either the reconfigure handler or the restart handler.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable

from lcm_runner.spec.hostlist import expand

# A node's state in slurm.conf (State=FUTURE/UNKNOWN/DRAIN, Reason=...): changing only these on an existing
# NodeName line is applied by `scontrol reconfigure` (measured on Slurm 22.05: FUTURE <-> UNKNOWN/DRAIN
# transitions keep every other node and job as they are; docs/nodes.md).
_STATE_KEYS = ("state", "reason")


def _logical_lines(text: str) -> list[str]:
    """Lines without comments and blanks, continuation lines ('\\' at the end) joined."""
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].rstrip()
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = (pending + line).strip()
        pending = ""
        if line:
            lines.append(line)
    if pending.strip():
        lines.append(pending.strip())
    return lines


def slurm_conf_entries(text: str) -> dict[str, list[str]]:
    """Map each key (case-insensitive, as Slurm reads them) to the normalised lines that set it."""
    entries: dict[str, list[str]] = {}
    for line in _logical_lines(text):
        key = line.split("=", 1)[0].strip().lower()
        entries.setdefault(key, []).append(" ".join(line.split()))
    return entries


def node_table(lines: list[str]) -> list[str]:
    """NodeName lines without their State= and Reason= words, sorted: the node table Slurm 22.05 can only
    change with a restart (names and hardware), whatever the nodes' states."""
    table = []
    for line in lines:
        try:
            words = shlex.split(line)
        except ValueError:
            words = line.split()
        kept = [w for w in words if w.split("=", 1)[0].lower() not in _STATE_KEYS]
        table.append(" ".join(kept))
    return sorted(table)


def slurm_restart_keys_changed(old: str, new: str, keys: Iterable[str]) -> list[str]:
    """Names of the restart-only keys whose lines differ between two slurm.conf texts.

    NodeName lines are compared as the node table (names and hardware, not State/Reason), so a node moving
    between FUTURE and in service is a reconfigure. An empty old text (first install) counts as every
    present key changed.
    """
    old_entries = slurm_conf_entries(old or "")
    new_entries = slurm_conf_entries(new or "")
    changed = []
    for key in keys:
        k = key.lower()
        before, after = old_entries.get(k, []), new_entries.get(k, [])
        if k == "nodename":
            if node_table(before) != node_table(after):
                changed.append(key)
        elif before != after:
            changed.append(key)
    return changed


def slurm_hostlist_expand(expression: str) -> list[str]:
    """Names of a Slurm hostlist ('' -> [])."""
    return expand(expression) if expression and expression.strip() else []


class FilterModule:
    def filters(self) -> dict[str, object]:
        return {
            "slurm_conf_entries": slurm_conf_entries,
            "slurm_restart_keys_changed": slurm_restart_keys_changed,
            "slurm_hostlist_expand": slurm_hostlist_expand,
        }
