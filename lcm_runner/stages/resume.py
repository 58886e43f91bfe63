"""resume: after the checkpoint at step N, cancel the job; resubmit it with --load; confirm the first new
step is N+1 and its loss is in line with the pre-kill trajectory; measure submission -> first new step."""

from __future__ import annotations

import math
import time
from pathlib import Path

from lcm_runner.contracts import EVENT_CKPT_END, EVENT_RESUME, LATEST_FILE
from lcm_runner.stages.common import (
    JobWatch,
    StageContext,
    StageError,
    StageResult,
    is_step,
    job_finished_ok,
    losses_by_step,
    reference_losses,
    rel_diff,
)

STAGE = "resume"
LOSS_REL_TOL = 1e-2  # "in line with the pre-kill trajectory"; the measured difference is reported


def latest_step(ckpt_dir: Path) -> int | None:
    """Megatron's tracker file: the step of the last complete checkpoint."""
    try:
        return int((ckpt_dir / LATEST_FILE).read_text().strip())
    except (OSError, ValueError):
        return None


def run(ctx: StageContext) -> StageResult:
    res = StageResult(STAGE)
    ctx.progress.begin(STAGE, ctx.run_dir)
    n = ctx.cfg.save_interval
    try:
        spec = ctx.spec("resume", "resume")
        ckpt_dir = Path(spec.train_args[spec.train_args.index("--save") + 1])
        job = ctx.launcher.submit(spec)
        res.job_ids.append(job.id)
        res.event(f"submitted {job.id}", job.submitted)
        watch = JobWatch(ctx, job)
        saved = watch.until(
            lambda r: r.event == EVENT_CKPT_END and r.step == n and r.rank == 0, f"the checkpoint at step {n}"
        )
        res.event(f"checkpoint at step {n} complete", saved.ts)
        after = watch.until(is_step(min_step=n + 1), f"a step after {n}")
        ctx.progress.info(f"step {after.step} ran after the checkpoint: cancelling job {job.id}")
        ctx.launcher.cancel(job, hard=True)  # a crash-like stop: nothing saved past step N
        res.event(f"cancelled {job.id} at step {after.step}", time.time())
        watch.finish(30)
        ckpt_step = latest_step(ckpt_dir)
        if ckpt_step is None:
            raise StageError(f"no {LATEST_FILE} in {ckpt_dir} after the cancel")
        pre_kill = losses_by_step(watch.records)

        job2 = ctx.launcher.submit(spec)
        res.job_ids.append(job2.id)
        res.event(f"resubmitted {job2.id} with --load {ckpt_dir}", job2.submitted)
        ctx.progress.info(f"resubmitted as job {job2.id}; latest checkpoint is step {ckpt_step}")
        watch2 = JobWatch(ctx, job2)
        first = watch2.until(lambda r: r.event == "step", "the first new step")
        res.event(f"first new step {first.step}", first.ts)
        resumed = next((r for r in watch2.records if r.event == EVENT_RESUME and r.rank == 0), None)
        st2 = watch2.finish()
    except StageError as e:
        res.checks["stage ran"] = False
        res.decide(str(e))
        return _end(ctx, res)
    first0 = next(r for r in sorted(watch2.records, key=lambda r: r.ts) if r.event == "step" and r.rank == 0)
    first_new = int(first0.step or 0)
    new_losses = losses_by_step(watch2.records)
    ref = reference_losses(ctx) or pre_kill
    loss_ref = ref.get(first_new, pre_kill.get(first_new, math.nan))
    loss_resumed = new_losses.get(first_new, math.nan)
    m = {
        "ckpt_step": float(ckpt_step),
        "first_new_step": float(first_new),
        "resume_s": first.ts - job2.submitted,
        "load_s": float(resumed.get("load_s")) if resumed is not None else math.nan,
        "loss_ref": loss_ref,
        "loss_resumed": loss_resumed,
        "loss_rel_diff": rel_diff(loss_resumed, loss_ref),
        "pre_kill_loss_at_first_new_step": pre_kill.get(first_new, math.nan),
    }
    res.metrics.update(m)
    t = ctx.cfg.targets
    res.checks[f"first new step is N+1 = {ckpt_step + 1}"] = first_new == ckpt_step + 1
    res.checks[f"loss within {LOSS_REL_TOL:g} of the uninterrupted run"] = m["loss_rel_diff"] <= LOSS_REL_TOL
    res.checks[f"resume <= {t.resume_s_max:g}s"] = m["resume_s"] <= t.resume_s_max
    res.checks["resumed job completed"] = job_finished_ok(st2)
    res.decide(
        f"checkpoint {ckpt_step} -> first new step {first_new} in {m['resume_s']:.1f}s "
        f"(load {m['load_s']:.2f}s), loss {loss_resumed:.6f} vs {loss_ref:.6f} "
        f"(rel diff {m['loss_rel_diff']:.1e})"
    )
    return _end(ctx, res)


def _end(ctx: StageContext, res: StageResult) -> StageResult:
    res.write(ctx.run_dir)
    ctx.progress.end(res, ctx.run_dir)
    return res
