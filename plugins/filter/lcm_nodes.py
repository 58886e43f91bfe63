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


# sinfo %T of a node Slurm would schedule on: idle (no job), or running jobs (busy).
_IDLE = {"idle"}
_BUSY = {"allocated", "mixed", "completing"}
SWEEP_PARTNER_POLICIES = ("auto", "idle", "any", "none")


def lcm_sinfo_states(text: str | None) -> dict[str, str]:
    """`sinfo --noheader --Node --format=%N|%T` -> {node: state} (lowercased: `idle`, `mixed`, `allocated`,
    `drained` ...; a `*` suffix (not responding) is kept, so such a node is neither idle nor busy)."""
    states: dict[str, str] = {}
    for line in (text or "").splitlines():
        name, sep, state = line.strip().partition("|")
        if sep and name:
            states[name] = state.strip().lower()
    return states


def lcm_sweep_plan(
    passed: list[str],
    candidates: list[str],
    states: dict[str, str] | None,
    policy: str = "auto",
    gpus_per_node: int = 0,
) -> dict[str, Any]:
    """Which nodes run the cross-node all-reduce sweep of add_nodes' burn-in (docs/nodes.md).

    passed: the nodes being added that passed their one-node burn-in, in inventory order; candidates: the
    compute nodes in service that are not being added (partners for a single new node); states: their Slurm
    state (lcm_sinfo_states), or None without Slurm (no scheduler: every candidate counts as idle). policy
    (burn_in_cluster_partner): auto = an idle node, else on CPU nodes (gpus_per_node 0) a busy one; idle =
    an idle node only; any = an idle node, else a busy one; none = never a partner. Returns {"nodes": the
    sweep's nodes in rank order (rank 0 the master; [] = no sweep), "partner": the node in service that
    joins a single new node (or None), "why": one line for the log}."""
    if policy not in SWEEP_PARTNER_POLICIES:
        raise ValueError(
            f"burn_in_cluster_partner={policy!r}: must be one of {', '.join(SWEEP_PARTNER_POLICIES)}"
        )
    passed = list(dict.fromkeys(passed or []))
    if len(passed) >= 2:
        return {"nodes": passed, "partner": None, "why": f"{len(passed)} new nodes: {', '.join(passed)}"}
    if not passed:
        return {
            "nodes": [],
            "partner": None,
            "why": "no new node passed its one-node burn-in: no cross-node sweep",
        }
    new = passed[0]
    others = [c for c in dict.fromkeys(candidates or []) if c != new]
    if policy == "none":
        return {
            "nodes": [],
            "partner": None,
            "why": f"{new} alone and burn_in_cluster_partner=none: no cross-node sweep",
        }
    if states is None:
        idle, busy = others, []
    else:
        idle = [c for c in others if states.get(c) in _IDLE]
        busy = [c for c in others if states.get(c) in _BUSY]
    if idle:
        return {
            "nodes": [new, idle[0]],
            "partner": idle[0],
            "why": f"{new} with {idle[0]} (idle, in service)",
        }
    if busy and (policy == "any" or (policy == "auto" and int(gpus_per_node or 0) == 0)):
        return {
            "nodes": [new, busy[0]],
            "partner": busy[0],
            "why": f"{new} with {busy[0]} (in service, running jobs: the sweep shares it for a few seconds)",
        }
    if busy:
        why = (
            f"{new} alone: no idle compute node in service, and the busy ones have GPUs "
            f"({', '.join(busy)}); burn_in_cluster_partner=any would pair it with {busy[0]}: "
            "no cross-node sweep"
        )
    else:
        why = f"{new} alone: no other compute node in service (idle or running jobs): no cross-node sweep"
    return {"nodes": [], "partner": None, "why": why}


def lcm_sweep_verdict(
    report: dict[str, Any] | None, nodes: list[str], error: str | None = None
) -> dict[str, Any]:
    """The cross-node sweep's verdict from one node's `lcm-runner probe --only allreduce --nnodes N` report
    (None when there is none), or the step that failed (error): {"ok": bool, "reason": the Slurm drain
    reason, <= 200 characters, "" when ok, "busbw": the figure or None}."""
    where = f"lcm-burn-in: cross-node allreduce ({'+'.join(nodes)})"
    if error:
        return {"ok": False, "reason": f"{where}: {error}"[:200], "busbw": None}
    checks = [c for c in (report or {}).get("checks", []) if isinstance(c, dict)]
    sweep = [c for c in checks if c.get("name") == "allreduce"]
    if not sweep:
        return {"ok": False, "reason": f"{where}: no allreduce check in the report"[:200], "busbw": None}
    value = sweep[0].get("value")
    if sweep[0].get("scope") != "cluster":
        return {
            "ok": False,
            "reason": f"{where}: the report's allreduce is not across nodes"[:200],
            "busbw": value,
        }
    failed = [c for c in lcm_burn_in_summaries(checks) if c.get("status") == "fail"]
    if failed or sweep[0].get("status") != "pass":
        text = "; ".join(c["summary"] for c in failed) or f"allreduce: {sweep[0].get('status')}"
        return {"ok": False, "reason": f"{where}: {text}"[:200], "busbw": value}
    return {"ok": True, "reason": "", "busbw": value}


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "lcm_node_list": lcm_node_list,
            "lcm_scontrol_node": lcm_scontrol_node,
            "lcm_burn_in_summaries": lcm_burn_in_summaries,
            "lcm_sinfo_states": lcm_sinfo_states,
            "lcm_sweep_plan": lcm_sweep_plan,
            "lcm_sweep_verdict": lcm_sweep_verdict,
        }
