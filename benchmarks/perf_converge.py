"""The "Converges" section of docs/performance.md (benchmarks/performance.py): site.yml on the lab
(benchmarks/converge.py results), the 8-vs-2 node ratio, and the per-task cost of ansible-core variants
(benchmarks/ansible_core.py results)."""

from __future__ import annotations

import json
from pathlib import Path

from _figures import RESULTS, Figure, _missing, _rel


def _converge_run(run: str) -> tuple[dict, dict, Path] | None:
    """The newest converge result holding a run of that name, or of the default lab's 2 compute nodes in a
    --compute-nodes run (`<run>-c2`: the same lab): (result, run, file)."""
    for f in sorted(RESULTS.glob("converge-*.json"), reverse=True):
        d = json.loads(f.read_text())
        r = next((x for x in d["runs"] if x["name"] in (run, f"{run}-c2")), None)
        if r is not None:
            return d, r, f
    return None


def converge_figures() -> list[Figure]:
    out = []
    labels = {
        "unchanged": "no-op re-converge (plain site.yml: the unchanged check skips every layer)",
        "noop": "no-op re-converge, every role run (lcm_converge_full=true)",
        "fresh": "fresh converge (image cached)",
    }
    for run, target in (("unchanged", 20.0), ("noop", 20.0), ("fresh", 90.0)):
        got = _converge_run(run)
        label = labels[run]
        if got is None:
            out.append(_missing(f"{label} of the lab", f"<= {target:.0f} s", "no converge result with it"))
            continue
        d, r, f = got
        hosts = [h for h in r.get("per_host", {}) if h != "localhost"] or d["nodes"]
        name = f"{label}, {len(hosts)} lab nodes"
        slow = r.get("slowest_tasks", [])[:2]
        why = f"{r.get('ok', 0)} task results over the nodes; slowest: " + "; ".join(
            f"{t['task']} {t['seconds']:.0f} s" for t in slow
        )
        if run in ("noop", "unchanged") and r.get("changed"):
            why = f"{r['changed']} tasks changed (sources changed under the run); " + why
        ok = r["seconds"] <= target and r["rc"] == 0 and (run == "fresh" or r.get("changed") == 0)
        value, absolute = f"{r['seconds']:.0f} s", f"{r['seconds'] / target:.2f}x the target"
        out.append(Figure(name, f"<= {target:.0f} s", value, absolute, ok, _rel(f), "" if ok else why))
        plain = next((x for x in d["runs"] if x["name"] == f"{run}-nocache"), None)
        if plain is not None and run != "unchanged":
            ratio = r["seconds"] / plain["seconds"]
            absolute = (
                f"{r['seconds']:.0f} s with the module cache vs {plain['seconds']:.0f} s without "
                "(common_module_cache=false), one run"
            )
            out.append(Figure(f"{label}: with the nodes' module cache / without", "none (beside)",
                              f"{ratio:.2f}", absolute, None, _rel(f)))  # fmt: skip
        mito = next((x for x in d["runs"] if x["name"] == f"{run}-mitogen_linear"), None)
        if mito is not None:
            ratio = mito["seconds"] / r["seconds"]
            ok = mito["seconds"] <= target and mito["rc"] == 0 and (run != "noop" or mito["changed"] == 0)
            absolute = f"{mito['seconds']:.0f} s = {ratio:.2f}x the linear {run} of the same run"
            why = "" if ok else f"not adopted (an extra dependency; {ratio:.2f}x linear); over the target"
            out.append(Figure(f"{label} with mitogen_linear (mitogen 0.3.54)", f"<= {target:.0f} s",
                              f"{mito['seconds']:.0f} s", absolute, ok, _rel(f), why))  # fmt: skip
    out.append(scale_figure())
    return out


def ansible_core_figures() -> list[Figure]:
    """Per host-task cost of each measured ansible-core variant / the locked release (ansible_core.py):
    each variant from the newest result file that has it."""
    name = "task cost, ansible-core releases / the locked one"
    files = sorted(RESULTS.glob("ansible-core-*.json"), reverse=True)
    if not files:
        return [_missing(name, "none (beside)", "benchmarks/ansible_core.py not run")]
    out: dict[str, Figure] = {}
    for f in files:
        d = json.loads(f.read_text())
        locked = next(x for x in d["releases"] if x["version"] == d["locked"] and not x.get("module_cache"))
        for r in d["releases"]:
            if r is locked:
                continue
            absolute = (
                f"{r['ms_per_host_task_wall']:.0f} vs {locked['ms_per_host_task_wall']:.0f} ms wall per "
                f"host-task; CPU {r['cpu_vs_locked']:.2f}x ({d['tasks']} tasks x {d['hosts']} local hosts, "
                f"median of {d['repeats']})"
            )
            variant = f"{r['version']} + the nodes' module cache" if r.get("module_cache") else r["version"]
            name = f"task cost, ansible-core {variant} / the locked {d['locked']}"
            out.setdefault(
                name, Figure(name, "none (beside)", f"{r['wall_vs_locked']:.2f}", absolute, None, _rel(f))
            )
    return list(out.values())


def scale_figure() -> Figure:
    """Fresh converge with 8 compute nodes / with 2, from one converge run (--compute-nodes 2,8)."""
    name, target = "fresh converge, 8 compute nodes / 2", "<= 1.5"
    for f in sorted(RESULTS.glob("converge-*.json"), reverse=True):
        d = json.loads(f.read_text())
        runs = {x["name"]: x for x in d["runs"]}
        two, eight = runs.get("fresh-c2"), runs.get("fresh-c8")
        if two is None or eight is None:
            continue
        ratio = eight["seconds"] / two["seconds"]
        per_node = (eight["seconds"] - two["seconds"]) / 6
        ok = ratio <= 1.5 and two["rc"] == 0 and eight["rc"] == 0
        absolute = f"{two['seconds']:.0f} s -> {eight['seconds']:.0f} s; {per_node:.1f} s per added node"
        why = "" if ok else (
            f"{per_node:.1f} s per added compute node on 2 cores (the nodes' installs share the host's CPUs "
            f"and disk); slowest with 8: " + "; ".join(
                f"{t['task']} {t['seconds']:.0f} s" for t in eight.get("slowest_tasks", [])[:2])
        )  # fmt: skip
        return Figure(name, target, f"{ratio:.2f}", absolute, ok, _rel(f), why)
    return _missing(name, target, "no converge run with --compute-nodes 2,8 committed")
