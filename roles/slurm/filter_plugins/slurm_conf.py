"""Filters for the slurm role: decide whether a slurm.conf change needs a daemon restart.

`scontrol reconfigure` re-reads most of slurm.conf, but some keys (ports, plugin types, the node
definitions, the controller host...) only take effect when the daemons restart. The role renders
the new file, compares it with the installed one through `slurm_restart_keys_changed` and notifies
either the reconfigure handler or the restart handler.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from typing import Any

from lcm_runner.spec.hostlist import compress, expand

# A node's state in slurm.conf (State=FUTURE/UNKNOWN/DRAIN, Reason=...): changing only these on an existing
# NodeName line is applied by `scontrol reconfigure` (measured on Slurm 22.05: FUTURE <-> UNKNOWN/DRAIN
# transitions keep every other node and job as they are; docs/nodes.md).
_STATE_KEYS = ("state", "reason")
# A node's address (NodeAddr=, the host variable slurm_node_addr): part of the node table only for a node in
# service; a FUTURE line gets or loses it as a host joins (FUTURE with its address, then in service) or
# leaves the inventory, which `scontrol reconfigure` applies like the state change itself.
_ADDR_KEY = "nodeaddr"


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
    """One entry per node (NodeName expressions expanded), without the State= and Reason= words, sorted:
    the node table Slurm 22.05 can only change with a restart (names and hardware), whatever the nodes'
    states and however the names are grouped into ranges."""
    table = []
    for line in lines:
        try:
            words = shlex.split(line)
        except ValueError:
            words = line.split()
        kept = [w for w in words if w.split("=", 1)[0].lower() not in (*_STATE_KEYS, _ADDR_KEY)]
        if not kept or not kept[0].lower().startswith("nodename="):
            table.append(" ".join(kept))
            continue
        rest = " ".join(kept[1:])
        key, expr = kept[0].split("=", 1)  # the key as written: Slurm reads keys case-blind, values not
        try:
            names = expand(expr)
        except ValueError:
            names = [expr]
        table += [f"{key}={n} {rest}".rstrip() for n in names]
    return sorted(table)


def node_addrs(lines: list[str]) -> dict[str, str]:
    """Node name -> its NodeAddr ("" without one), for the nodes whose line is not State=FUTURE."""
    addrs: dict[str, str] = {}
    for line in lines:
        try:
            words = shlex.split(line)
        except ValueError:
            words = line.split()
        fields = {w.split("=", 1)[0].lower(): w.split("=", 1)[1] for w in words if "=" in w}
        if "nodename" not in fields or fields.get("state", "").upper() == "FUTURE":
            continue
        try:
            names = expand(fields["nodename"])
        except ValueError:
            names = [fields["nodename"]]
        addrs.update(dict.fromkeys(names, fields.get(_ADDR_KEY, "")))
    return addrs


def slurm_node_lines(rows: Iterable[Any]) -> list[str]:
    """NodeName= values for slurm.conf from [name, attributes] rows: the names with the same attributes
    (hardware and state) as one hostlist range, `gpu[0001-1000] CPUs=224 ... State=UNKNOWN`, in the order
    the attribute sets first appear. 1,000 alike nodes are one line, not 1,000."""
    by_attrs: dict[str, list[str]] = {}
    for name, attrs in rows:
        by_attrs.setdefault(" ".join(str(attrs).split()), []).append(str(name))
    return [f"{compress(names)} {attrs}" for attrs, names in by_attrs.items()]


def slurm_list_minus(items: Iterable[Any], remove: Iterable[Any]) -> list[Any]:
    """items without those in remove, order kept; linear (`reject('in', big list)` is quadratic, and with
    Ansible's lazy lists about 15 ms per 1,000 x 1,000 test: seconds for a 1,000-node cluster)."""
    gone = set(remove)
    return [x for x in items if x not in gone]


def slurm_list_within(items: Iterable[Any], keep: Iterable[Any]) -> list[Any]:
    """items that are in keep, order kept; linear (see slurm_list_minus)."""
    kept = set(keep)
    return [x for x in items if x in kept]


def slurm_partition_hosts(
    group_names: Iterable[str], groups: Any, active: Iterable[str], hostvars: Any
) -> list[str]:
    """The node names of a partition: the active hosts of its inventory groups, each once, in order."""
    usable = set(active)
    names: list[str] = []
    seen: set[str] = set()
    for grp in group_names:
        for host in groups.get(grp) or []:
            if host in usable:
                name = str(hostvars[host]["ansible_hostname"])
                if name not in seen:
                    seen.add(name)
                    names.append(name)
    return names


def slurm_hostlist_compress(names: Iterable[str]) -> str:
    """The hostlist range form of names: ['gpu01', 'gpu02', 'gpu03'] -> 'gpu[01-03]'."""
    return compress([str(n) for n in names])


def slurm_restart_keys_changed(old: str, new: str, keys: Iterable[str]) -> list[str]:
    """Names of the restart-only keys whose lines differ between two slurm.conf texts.

    NodeName lines are compared as the node table (names and hardware, not State/Reason/NodeAddr), so a node
    moving between FUTURE and in service is a reconfigure; a changed NodeAddr of a node in service before and
    after is a restart. An empty old text (first install) counts as every
    present key changed.
    """
    old_entries = slurm_conf_entries(old or "")
    new_entries = slurm_conf_entries(new or "")
    changed = []
    for key in keys:
        k = key.lower()
        before, after = old_entries.get(k, []), new_entries.get(k, [])
        if k == "nodename":
            was, now = node_addrs(before), node_addrs(after)
            moved = [
                n for n in was.keys() & now.keys() if was[n] != now[n]
            ]  # an address of a node in service
            if node_table(before) != node_table(after) or moved:
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
            "slurm_hostlist_compress": slurm_hostlist_compress,
            "slurm_node_lines": slurm_node_lines,
            "slurm_list_minus": slurm_list_minus,
            "slurm_list_within": slurm_list_within,
            "slurm_partition_hosts": slurm_partition_hosts,
        }
