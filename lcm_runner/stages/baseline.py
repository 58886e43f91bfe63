"""baseline: submit the training job, follow it, and confirm the loss decreases and the per-step time
is stable; measure step time, throughput, the communication share and checkpoint writes."""

from __future__ import annotations

import math
import statistics

from lcm_runner import telemetry
from lcm_runner.contracts import EVENT_CKPT_END
from lcm_runner.stages.common import (
    JobWatch,
    StageContext,
    StageError,
    StageResult,
    cv,
    is_exit,
    job_finished_ok,
    losses_by_step,
    p99,
)

STAGE = "baseline"
# "Stable" step time, after the first (warm-up) step: no drift (median of the second half within
# [1/DRIFT_MAX, DRIFT_MAX] of the first half's) and no heavy tail (p99 <= TAIL_MAX x median). The cv is
# reported too, but a tiny CPU model's ~20 ms steps on a shared machine are noisy by nature.
STEP_TIME_DRIFT_MAX = 1.5
STEP_TIME_TAIL_MAX = 5.0
WARMUP_STEPS = 1


def measure(records: list[telemetry.Record], train_iters: int) -> dict[str, float]:
    """The baseline metrics (stage contract) of one uninterrupted job's records."""
    steps0 = [r for r in telemetry.reporting_steps(records) if (r.step or 0) > WARMUP_STEPS]
    times = [float(r.get("step_time_s")) for r in steps0 if isinstance(r.get("step_time_s"), int | float)]
    losses = losses_by_step(records)
    tps = [float(r.get("tokens_per_s")) for r in steps0 if isinstance(r.get("tokens_per_s"), int | float)]
    comm = [
        float(r.get("comm_time_s")) / float(r.get("step_time_s"))
        for r in steps0
        if isinstance(r.get("comm_time_s"), int | float) and r.get("step_time_s")
    ]
    ckpts = [r for r in telemetry.of_event(records, EVENT_CKPT_END)]
    ckpt0 = [r for r in ckpts if r.rank == 0]
    by_step: dict[int, int] = {}
    for r in ckpts:
        by_step[int(r.step or 0)] = by_step.get(int(r.step or 0), 0) + int(r.get("bytes") or 0)
    m: dict[str, float] = {
        "steps": float(len(losses)),
        "step_time_mean_s": statistics.fmean(times) if times else math.nan,
        "step_time_median_s": statistics.median(times) if times else math.nan,
        "step_time_p99_s": p99(times),
        "step_time_cv": cv(times),
        "loss_first": losses[min(losses)] if losses else math.nan,
        "loss_last": losses[max(losses)] if losses else math.nan,
        "tokens_per_s": statistics.fmean(tps) if tps else math.nan,
        "comm_fraction": statistics.fmean(comm) if comm else math.nan,
        "ckpt_write_s": statistics.fmean(float(r.get("total_s")) for r in ckpt0) if ckpt0 else math.nan,
        "ckpt_blocking_s": statistics.fmean(float(r.get("blocking_s")) for r in ckpt0) if ckpt0 else math.nan,
        "ckpt_bytes": float(by_step[max(by_step)]) if by_step else math.nan,
        "checkpoints": float(len(ckpt0)),
    }
    per: dict[str, list[float]] = {}  # rank 0's share of each collective (lcm_runner/train/comm.py)
    for r in steps0:
        by = r.get("comm")
        if isinstance(by, dict) and r.get("step_time_s"):
            for name, t in by.items():
                if isinstance(t, int | float):
                    per.setdefault(str(name), []).append(float(t) / float(r.get("step_time_s")))
    for name, shares in sorted(per.items()):
        m[f"comm_fraction.{name}"] = statistics.fmean(shares)
    if len(times) >= 4:
        half = len(times) // 2
        m["step_time_drift"] = statistics.median(times[half:]) / statistics.median(times[:half])
        m["step_time_tail"] = m["step_time_p99_s"] / m["step_time_median_s"]
    if losses and len(losses) >= 4:
        # least-squares slope of loss over step: negative when the loss goes down overall
        xs = sorted(losses)
        mx, my = statistics.fmean(xs), statistics.fmean(losses[s] for s in xs)
        m["loss_slope"] = sum((x - mx) * (losses[x] - my) for x in xs) / sum((x - mx) ** 2 for x in xs)
    return m


def run(ctx: StageContext) -> StageResult:
    res = StageResult(STAGE)
    ctx.progress.begin(STAGE, ctx.run_dir)
    try:
        spec = ctx.spec("baseline", "baseline")
        job = ctx.launcher.submit(spec)
        res.job_ids.append(job.id)
        res.event(f"submitted {job.id}", job.submitted)
        ctx.progress.info(f"submitted job {job.id} ({spec.nodes} nodes x {spec.procs_per_node} ranks)")
        watch = JobWatch(ctx, job)
        first = watch.until(lambda r: r.event == "step", "the first step")
        res.event(f"first step {first.step}", first.ts)
        st = watch.finish()
        exits = [r for r in watch.records if is_exit(r)]
        res.event(f"job {job.id} {st.state.value}")
    except StageError as e:
        res.summary = str(e)
        res.checks["job ran"] = False
        res.decide(str(e))
        return _end(ctx, res)
    m = measure(watch.records, ctx.cfg.train_iters)
    res.metrics.update(m)
    t = ctx.cfg.targets
    res.checks["job completed"] = job_finished_ok(st) and all(r.get("code") == 0 for r in exits)
    res.checks[f"all {ctx.cfg.train_iters} steps"] = m["steps"] == ctx.cfg.train_iters
    res.checks["loss decreasing"] = m["loss_last"] < m["loss_first"] and m.get("loss_slope", 0.0) < 0
    drift, tail = m.get("step_time_drift", math.nan), m.get("step_time_tail", math.nan)
    res.checks[f"step time without drift (x{1 / STEP_TIME_DRIFT_MAX:.2f}..x{STEP_TIME_DRIFT_MAX:g})"] = (
        1 / STEP_TIME_DRIFT_MAX <= drift <= STEP_TIME_DRIFT_MAX
    )
    res.checks[f"step time p99 <= {STEP_TIME_TAIL_MAX:g}x median"] = tail <= STEP_TIME_TAIL_MAX
    if not math.isnan(m["ckpt_write_s"]):
        res.checks[f"checkpoint write <= {t.ckpt_write_s_max:g}s"] = m["ckpt_write_s"] <= t.ckpt_write_s_max
    res.decide(
        f"loss {m['loss_first']:.4f} -> {m['loss_last']:.4f} over {m['steps']:.0f} steps, "
        f"step {m['step_time_mean_s'] * 1000:.0f} ms (cv {m['step_time_cv']:.2f}, p99 "
        f"{m['step_time_p99_s'] * 1000:.0f} ms, drift x{drift:.2f}), ckpt {m['ckpt_write_s']:.2f}s"
    )
    return _end(ctx, res)


def _end(ctx: StageContext, res: StageResult) -> StageResult:
    res.write(ctx.run_dir)
    ctx.progress.end(res, ctx.run_dir)
    return res
