"""Filters for the slurm role: decide whether a slurm.conf change needs a daemon restart.

`scontrol reconfigure` re-reads most of slurm.conf, but some keys (ports, plugin types, the node
definitions, the controller host...) only take effect when the daemons restart. The role renders
the new file, compares it with the installed one through `slurm_restart_keys_changed` and notifies
either the reconfigure handler or the restart handler.
"""

from __future__ import annotations

from collections.abc import Iterable


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


def slurm_restart_keys_changed(old: str, new: str, keys: Iterable[str]) -> list[str]:
    """Names of the restart-only keys whose lines differ between two slurm.conf texts.

    An empty old text (first install) counts as every present key changed.
    """
    old_entries = slurm_conf_entries(old or "")
    new_entries = slurm_conf_entries(new or "")
    changed = []
    for key in keys:
        k = key.lower()
        if old_entries.get(k, []) != new_entries.get(k, []):
            changed.append(key)
    return changed


class FilterModule:
    def filters(self) -> dict[str, object]:
        return {
            "slurm_conf_entries": slurm_conf_entries,
            "slurm_restart_keys_changed": slurm_restart_keys_changed,
        }
