"""The rows of README's Measured table: each computed from the committed files it names.

Over ~300 lines: one function per README row, each naming the committed files it reads.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from lcm_runner.report.readme_rows_engine import row_engine_vs_megatron
from lcm_runner.report.readme_rows_nodes import row_h200_burn_in, row_lab_add_node, row_lab_mixed_faults
from lcm_runner.report.readme_sources import (
    CONVERGE,
    ENGINE,
    INTEGRITY_CHECKSUM,
    INTEGRITY_TELEMETRY,
    LAB_SLURM_FAULT,
    MATRIX_CPU,
    MATRIX_LAB_NODES,
    STAGES_RUN1,
    STAGES_RUN2,
    Results,
    ResultsError,
    Row,
    _get,
    _matrix_rows,
    _note_num,
    _num,
    _span,
)


def row_converge(res: Results) -> Row:
    doc = res.json(CONVERGE)
    runs = {r.get("name"): r for r in _get(doc, CONVERGE, "runs")}
    fresh, noop = runs.get("fresh"), runs.get("noop")
    if fresh is None or noop is None:
        raise ResultsError(f"{CONVERGE}: needs a 'fresh' and a 'noop' run")
    hosts = [h for h in _get(fresh, CONVERGE, "per_host") if h != "localhost"]
    unchanged = runs.get("unchanged")
    value = (
        f"{_num(_get(fresh, CONVERGE, 'seconds'), 0)} s / {_num(_get(noop, CONVERGE, 'seconds'), 0)} s "
        f"(re-run: {_get(noop, CONVERGE, 'changed')} changed)"
    )
    title = f"`site.yml` fresh converge of {len(hosts)} hosts (images cached) / re-run"
    if unchanged is not None:
        value = (
            f"{_num(_get(fresh, CONVERGE, 'seconds'), 0)} s / {_num(_get(noop, CONVERGE, 'seconds'), 0)} s / "
            f"{_num(_get(unchanged, CONVERGE, 'seconds'), 1)} s (re-runs: "
            f"{_get(noop, CONVERGE, 'changed')} and {_get(unchanged, CONVERGE, 'changed')} changed)"
        )
        title = (
            f"`site.yml` fresh converge of {len(hosts)} hosts (images cached) / re-run of every role "
            "(`lcm_converge_full=true`) / plain re-run (the unchanged check skips every play)"
        )
    return Row(
        title,
        "lab, `benchmarks/converge.py`",
        value,
        [CONVERGE],
    )


def row_lab_trainer_kill(res: Results) -> Row:
    m = _get(res.json(LAB_SLURM_FAULT), LAB_SLURM_FAULT, "metrics")
    vals = [
        _get(m, LAB_SLURM_FAULT, c, "downtime_s") for c in ("trainer_kill", "floor", "torchrun_restart_ref")
    ]
    return Row(
        "Trainer kill -> first new step: our agent / fresh-start floor / stock torchrun",
        "lab, real Slurm",
        " / ".join(f"{_num(v, 2)} s" for v in vals),
        [LAB_SLURM_FAULT],
    )


def row_lab_node_loss(res: Results) -> Row:
    nl = _get(res.json(LAB_SLURM_FAULT), LAB_SLURM_FAULT, "metrics", "node_loss")
    after = ",".join(_get(nl, LAB_SLURM_FAULT, "nodes_after"))
    value = (
        f"{_num(_get(nl, LAB_SLURM_FAULT, 'downtime_s'), 1)} s "
        f"(detected in {_num(_get(nl, LAB_SLURM_FAULT, 'detect_s'), 1)} s; ran again on {after})"
    )
    return Row(
        "Node loss (agent + ranks killed) -> Slurm requeue -> first new step",
        "lab, real Slurm",
        value,
        [LAB_SLURM_FAULT],
    )


def _lab_node_row(
    res: Results, faults: tuple[str, ...], what: str, back: str, back_nd: int, back_label: str
) -> Row:
    """Node faults of the lab (the last single-fault run of each): downtime, detection, DOWN, then the node
    back to idle; each fault must have a row."""
    src = MATRIX_LAB_NODES
    rows = [r for fault in faults for r in _matrix_rows(res, src, fault)]
    value = (
        f"{_span((_get(r, src, 'downtime_s') for r in rows), 2)} s "
        f"(detected {_span((_get(r, src, 'detected_s') for r in rows), 2)} s, "
        f"DOWN {_span((_note_num(src, r, r'marked DOWN ([0-9.]+) s') for r in rows), 2)} s); "
        f"{back_label}{_span((_note_num(src, r, back) for r in rows), back_nd)} s"
    )
    return Row(what, "lab, real Slurm", value, [src])


def row_lab_node_kill(res: Results) -> Row:
    return _lab_node_row(
        res,
        (
            "node killed (container SIGKILL), spare idle",
            "node killed (container SIGKILL), spare idle: node 0 (batch script, srun, store)",
        ),
        "Node container SIGKILLed (either node of the job, node 0 included) -> first new step on the "
        "survivor + spare; restarted node -> idle",
        r"-> idle ([0-9.]+) s",
        2,
        "node back -> idle ",
    )


def row_lab_partition(res: Results) -> Row:
    return _lab_node_row(
        res,
        ("network partition of a node (60 s)",),
        "Network partition of a node -> first new step; network back -> node idle",
        r"network back -> idle ([0-9.]+) s",
        1,
        "",
    )


def row_h200_baseline(res: Results) -> Row:
    run_yml, base = f"{STAGES_RUN1}/run.yml", f"{STAGES_RUN1}/stages/baseline.json"
    cfg = res.yaml(run_yml)
    model = _get(cfg, run_yml, "model")
    gpus = _get(cfg, run_yml, "nodes") * _get(cfg, run_yml, "gpus_per_node")
    m = _get(res.json(base), base, "metrics")
    dtype = "bf16" if model.get("bf16") else "fp32"
    value = (
        f"{_num(_get(m, base, 'step_time_mean_s') * 1e3, 0)} ms / "
        f"{_num(_get(m, base, 'step_time_p99_s') * 1e3, 0)} ms; "
        f"comm {_num(_get(m, base, 'comm_fraction') * 100, 1)} % of step"
    )
    return Row(
        f"MoE EP={_get(model, run_yml, 'ep')}, {gpus}x H200, seq {_get(model, run_yml, 'seq_length')} "
        f"{dtype}: step mean / p99",
        "H200 pair",
        value,
        [base, run_yml],
    )


def row_h200_resume(res: Results) -> Row:
    rel = f"{STAGES_RUN1}/stages/resume.json"
    m = _get(res.json(rel), rel, "metrics")
    ref, got = _get(m, rel, "loss_ref"), _get(m, rel, "loss_resumed")
    loss = "bitwise equal" if ref == got else f"rel diff {_get(m, rel, 'loss_rel_diff'):.1e}"
    return Row(
        "Resume: submission -> first new step; loss vs uninterrupted",
        "H200 pair",
        f"{_num(_get(m, rel, 'resume_s'), 1)} s; {loss}",
        [rel],
    )


def _fault_runs(res: Results) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for run in (STAGES_RUN1, STAGES_RUN2):
        rel = f"{run}/stages/fault.json"
        out.append((rel, _get(res.json(rel), rel, "metrics")))
    return out


def row_h200_trainer_kill(res: Results) -> Row:
    runs = _fault_runs(res)

    def over(case: str, nd: int) -> str:
        return _span((_get(m, rel, case, "downtime_s") for rel, m in runs), nd)

    return Row(
        "Trainer kill -9: our agent / floor / stock torchrun",
        "H200 pair",
        f"{over('trainer_kill', 1)} s / {over('floor', 1)} s / {over('torchrun_restart_ref', 0)} s",
        [rel for rel, _ in runs],
    )


def row_h200_node_loss(res: Results) -> Row:
    # Runs whose node-loss case completed (run-1's failed: the standby reused GPU 0, fixed before run-2).
    done = [
        (rel, m["node_loss"]) for rel, m in _fault_runs(res) if (m.get("node_loss") or {}).get("completed")
    ]
    if not done:
        raise ResultsError(f"{STAGES_RUN2}/stages/fault.json: no completed node_loss case")
    return Row(
        "Node loss (agent + trainer killed) -> first new step, hot standby",
        "H200 pair",
        f"{_span((_get(n, rel, 'downtime_s') for rel, n in done), 1)} s "
        f"(detected in {_span((_get(n, rel, 'detect_s') for rel, n in done), 1)} s)",
        [rel for rel, _ in done],
    )


def row_engine(res: Results) -> Row:
    doc = res.json(ENGINE)
    g1, g2 = _get(doc, ENGINE, "g1"), _get(doc, ENGINE, "g2ep2")
    tok = [_get(g, ENGINE, "tokens_per_s_median") / 1e3 for g in (g1, g2)]
    # The last async save of each run: the writer is warm (the first one pays D2H staging and the fork).
    blk = [_get(g, ENGINE, "async_saves", -1, "blocking_s") for g in (g1, g2)]
    return Row(
        f"Engine: {_get(g1, ENGINE, 'world_size')} GPU / EP={_get(g2, ENGINE, 'ep')} on "
        f"{_get(g2, ENGINE, 'world_size')} GPUs: tokens/s; async save blocking",
        "H200",
        f"{_num(tok[0], 1)} k / {_num(tok[1], 1)} k; {_num(blk[0], 2)} s / {_num(blk[1], 2)} s",
        [ENGINE],
    )


def _integrity_runs(res: Results) -> list[list[dict[str, Any]]]:
    """The telemetry split into processes (a `start` event begins one)."""
    runs: list[list[dict[str, Any]]] = []
    for rec in res.jsonl(INTEGRITY_TELEMETRY):
        if rec.get("event") == "start" or not runs:
            runs.append([])
        runs[-1].append(rec)
    return runs


def row_digest(res: Results) -> Row:
    ends = [
        r for run in _integrity_runs(res) for r in run if r.get("event") == "ckpt_end" and r.get("hash_s")
    ]
    if not ends:
        raise ResultsError(f"{INTEGRITY_TELEMETRY}: no ckpt_end event with hash_s")
    secs = [_get(r, INTEGRITY_TELEMETRY, "hash_s", "writers_max") for r in ends]
    per_gb = [s / (_get(r, INTEGRITY_TELEMETRY, "bytes") / 1e9) for s, r in zip(secs, ends, strict=True)]
    gb = _span((_get(r, INTEGRITY_TELEMETRY, "bytes") / 1e9 for r in ends), 2)
    algos = sorted({str(r.get("algorithm")) for r in ends})
    if len(algos) != 1:
        raise ResultsError(f"{INTEGRITY_TELEMETRY}: saves hashed with {algos}, expected one algorithm")
    chk = res.json(INTEGRITY_CHECKSUM)
    ratio = _get(chk, INTEGRITY_CHECKSUM, "algorithms", algos[0], "ratio_to_sha256")
    return Row(
        f"Checkpoint digest ({algos[0].replace('_', '-')}) in the writer, {gb} GB; "
        "vs sha256 of the same file",
        "H200",
        f"{_span(secs, 2)} s ({_span(per_gb, 2)} s/GB); {_num(ratio, 2)}x",
        [INTEGRITY_TELEMETRY, INTEGRITY_CHECKSUM],
    )


def row_damaged(res: Results) -> Row:
    runs = _integrity_runs(res)
    idx = next((i for i, run in enumerate(runs) if any(r.get("event") == "ckpt_rejected" for r in run)), None)
    if idx is None or idx == 0:
        raise ResultsError(f"{INTEGRITY_TELEMETRY}: no process with a ckpt_rejected event after a first one")
    run = runs[idx]
    rejected = [r for r in run if r.get("event") == "ckpt_rejected"]
    resume = next((r for r in run if r.get("event") == "resume"), None)
    if resume is None:
        raise ResultsError(f"{INTEGRITY_TELEMETRY}: no resume event after the ckpt_rejected one")
    size = {_get(r, INTEGRITY_TELEMETRY, "bytes") for r in runs[idx - 1] if r.get("event") == "ckpt_end"}
    if len(size) != 1:
        raise ResultsError(f"{INTEGRITY_TELEMETRY}: the checkpoints before the damage differ in size: {size}")
    # The fallback's steps against the same steps of the uninterrupted process before it.
    before = {
        _get(r, INTEGRITY_TELEMETRY, "step"): _get(r, INTEGRITY_TELEMETRY, "loss")
        for r in runs[idx - 1]
        if r.get("event") == "step"
    }
    after = {
        _get(r, INTEGRITY_TELEMETRY, "step"): _get(r, INTEGRITY_TELEMETRY, "loss")
        for r in run
        if r.get("event") == "step"
    }
    common = sorted(set(before) & set(after))
    if not common:
        raise ResultsError(f"{INTEGRITY_TELEMETRY}: no step of the fallback run to compare")
    if all(before[s] == after[s] for s in common):
        cont = "bitwise equal"
    else:
        cont = f"max rel diff {max(abs(after[s] - before[s]) / abs(before[s]) for s in common):.1e}"
    return Row(
        f"Damaged latest shard -> rejected, fallback, verify of {len(rejected) + 1} x "
        f"{_num(size.pop() / 1e9, 2)} GB; continuation",
        "H200",
        f"{_num(_get(resume, INTEGRITY_TELEMETRY, 'verify_s'), 2)} s; {cont}",
        [INTEGRITY_TELEMETRY],
    )


# Short names of the CPU matrix's faults, matched in order against the row's `fault` (others: as written).
_FAULT_SHORT = (
    (r"^every checkpoint damaged", "no good checkpoint"),
    (r"^damaged", "damage"),
    (r"^NaN", "NaN"),
    (r"filesystem full", "full disk"),
    (r"^ten rank kills", "10 kills in one job"),
    (r"killed during a save", "crash in save"),
    (r"^preemption", "preemption"),
)


def _short(fault: str) -> str:
    return next((name for pat, name in _FAULT_SHORT if re.search(pat, fault)), fault)


def row_fault_matrix_cpu(res: Results) -> Row:
    rows = res.jsonl(MATRIX_CPU)
    if not rows:
        raise ResultsError(f"{MATRIX_CPU}: empty")
    counts: dict[str, int] = {}
    for r in rows:
        counts[_short(str(r.get("fault")))] = counts.get(_short(str(r.get("fault"))), 0) + 1
    kinds = ", ".join(k if n == 1 else f"{k} x {n}" for k, n in counts.items())
    steps = sum(int(_get(r, MATRIX_CPU, "steps_lost")) for r in rows)
    good = sum(int(_get(r, MATRIX_CPU, "good_ckpts_lost")) for r in rows)
    value = f"{steps} steps, {good} good checkpoints lost"
    kills = [r for r in rows if r.get("fault") == "ten rank kills in one job"]
    if kills:
        k = kills[-1]
        final = (
            "final loss bitwise" if "final loss bitwise" in str(k.get("notes")) else "final loss not bitwise"
        )
        value += f"; 10 kills: {_num(_get(k, MATRIX_CPU, 'downtime_s'), 2)} s mean downtime, {final}"
    return Row(f"Fault matrix, CPU ({len(rows)} faults: {kinds})", "lab machine", value, [MATRIX_CPU])


ROWS: tuple[Callable[[Results], Row], ...] = (
    row_converge,
    row_lab_trainer_kill,
    row_lab_node_loss,
    row_lab_node_kill,
    row_lab_partition,
    row_lab_mixed_faults,
    row_h200_baseline,
    row_h200_resume,
    row_h200_trainer_kill,
    row_h200_node_loss,
    row_engine,
    row_engine_vs_megatron,
    row_digest,
    row_damaged,
    row_fault_matrix_cpu,
    row_h200_burn_in,
    row_lab_add_node,
)
