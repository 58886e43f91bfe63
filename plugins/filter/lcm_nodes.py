"""Filters of the node workflows (playbooks/add_nodes.yml, remove_nodes.yml; docs/nodes.md)."""

from __future__ import annotations

from typing import Any

from lcm_runner.spec.hostlist import HostlistError, expand


def lcm_node_list(value: Any) -> list[str]:
    """`-e nodes=...` as a list: a YAML list, or a string of comma-separated names / Slurm hostlists
    (`lab-node3`, `gpu[17-20],gpu23`). Raises ValueError naming the bad part."""
    if value is None:
        return []
    items = [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)]
    names: list[str] = []
    for item in items:
        item = item.strip()
        if not item:
            continue
        try:
            names += expand(item)
        except HostlistError as exc:
            raise ValueError(f"nodes={item!r}: {exc}") from exc
    return list(dict.fromkeys(names))


def lcm_scontrol_node(text: str) -> dict[str, str]:
    """`scontrol show node -o NAME` (one line of Key=Value words; Reason= runs to the end) -> {key: value}."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    fields: dict[str, str] = {}
    if " Reason=" in line:
        line, reason = line.split(" Reason=", 1)
        fields["Reason"] = reason.strip()
    for word in line.split():
        if "=" in word:
            key, val = word.split("=", 1)
            fields[key] = val
    return fields


def lcm_burn_in_summaries(checks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The checks of `lcm-runner health check` / `lcm-runner probe` reports, each with a short `summary`
    (`gemm_tflops 310.2 < 650`, or the check's reason) for the drain reason."""
    out = []
    for check in checks or []:
        name = str(check.get("name", "?"))
        value = check.get("value")
        limit = check.get("threshold", check.get("expected"))
        if value is not None and limit is not None and not isinstance(value, (dict, list)):
            summary = f"{name} {value} vs {limit}"
        else:
            summary = f"{name}: {check.get('reason') or check.get('status', '?')}"
        out.append({**check, "summary": summary})
    return out


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "lcm_node_list": lcm_node_list,
            "lcm_scontrol_node": lcm_scontrol_node,
            "lcm_burn_in_summaries": lcm_burn_in_summaries,
        }
