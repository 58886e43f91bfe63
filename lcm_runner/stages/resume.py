"""resume: after the checkpoint at step N, crash the job: SIGKILL of every rank and agent on every node at
once (`Launcher.kill_job`; never a cancel, whose SIGTERM the trainer's exit-signal handler turns into a
checkpoint: that would test save-on-signal, not crash recovery); check that nothing was saved after the
kill (no signal caught, no checkpoint record, `latest` still N, no complete iter dir past N); resubmit with
--load; confirm the first new step is N+1 and its loss is in line with the pre-kill trajectory; measure
submission -> first new step."""

from __future__ import annotations

import math
from pathlib import Path

from lcm_runner import telemetry
from lcm_runner.ckpt.integrity import COMPLETE_MARKER
from lcm_runner.contracts import (
    EVENT_CKPT_BEGIN,
    EVENT_CKPT_END,
    EVENT_EXIT,
    EVENT_RESUME,
    EVENT_SIGNAL,
    LATEST_FILE,
    ExitCode,
)
from lcm_runner.launch.base import HardKill, LaunchError
from lcm_runner.stages.common import (
    JobWatch,
    StageContext,
    StageError,
    StageResult,
    is_step,
    job_finished_ok,
    last_save_before,
    losses_by_step,
    reference_losses,
    rel_diff,
)
from lcm_runner.workloads.megatron_lm import checkpoint as mlm_checkpoint

STAGE = "resume"


def latest_step(ckpt_dir: Path) -> int | None:
    """Megatron's tracker file: the step of the last complete checkpoint."""
    try:
        return int((ckpt_dir / LATEST_FILE).read_text().strip())
    except (OSError, ValueError):
        return None


def iter_dirs(ckpt_dir: Path, foreign: bool = False) -> dict[int, bool]:
    """step -> complete, of each iter_ dir: for the project's trainer the marker written once every rank
    verified its shards; for a Megatron-LM workload (`foreign`) its own finish (metadata.json)."""
    out = {}
    for d in ckpt_dir.glob("iter_*"):
        if d.is_dir() and d.name[5:].isdigit():
            out[int(d.name[5:])] = (
                mlm_checkpoint.iter_complete(d) if foreign else (d / COMPLETE_MARKER).is_file()
            )
    return out


def after_kill(
    records: list, kill: HardKill, ckpt_dir: Path, latest: int | None, foreign: bool = False
) -> dict[str, object]:
    """What the killed job left: the last checkpoint completed before the kill, and every sign of a
    save on the way out (a caught signal, a checkpoint record after the kill, an exit 75, `latest` or
    a complete iter dir past that checkpoint)."""
    before = last_save_before(records, kill.ts)
    dirs = iter_dirs(ckpt_dir, foreign)
    return {
        "ckpt_before_kill": before,
        "latest_after_kill": -1 if latest is None else latest,
        "signal_records": sum(1 for r in records if r.event == EVENT_SIGNAL),
        "ckpt_records_after_kill": sum(
            1 for r in records if r.event in (EVENT_CKPT_BEGIN, EVENT_CKPT_END) and r.ts >= kill.ts
        ),
        "exit_records_after_kill": sum(1 for r in records if r.event == EVENT_EXIT and r.ts >= kill.ts),
        "requeue_exits": sum(
            1 for r in records if r.event == EVENT_EXIT and r.get("code") == int(ExitCode.REQUEUE)
        ),
        "complete_dirs_past_ckpt": sorted(s for s, ok in dirs.items() if ok and s > before),
        "partial_dirs_past_ckpt": sorted(s for s, ok in dirs.items() if not ok and s > before),
    }


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
        ctx.progress.info(f"step {after.step} ran after the checkpoint: SIGKILL of every rank of {job.id}")
        kill = ctx.launcher.kill_job(job)  # a crash: no rank can catch a signal and save on the way out
        res.event(f"killed {job.id} at step {after.step}: {kill.describe()}", kill.ts)
        watch.finish(30)
        ckpt_step = latest_step(ckpt_dir)
        if ckpt_step is None:
            raise StageError(f"no {LATEST_FILE} in {ckpt_dir} after the kill")
        left = after_kill(watch.records, kill, ckpt_dir, ckpt_step, ctx.cfg.workload.foreign)
        res.metrics["kill"] = {
            "signal": kill.signal,
            "at_step": float(after.step or 0),
            "ranks_killed": float(kill.ranks_killed),
            "world_size": float(spec.world_size),
            "processes_killed": kill.killed,
            "ranks_by_node": kill.ranks,
            "left": kill.left,
            "agent_exit": kill.agent_exit,
            "job_ended": kill.job_ended,
            **left,
        }
        ctx.progress.info(
            f"killed: {kill.describe()}; left {kill.left or 'nothing'}; latest checkpoint {ckpt_step}, "
            f"signals caught {left['signal_records']}, checkpoint records after the kill "
            f"{left['ckpt_records_after_kill']}"
        )
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
    except (StageError, LaunchError) as e:
        res.checks["stage ran"] = False
        res.decide(str(e))
        return _end(ctx, res)
    first0 = telemetry.reporting_steps(watch2.records)[0]
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
    k = res.metrics["kill"]
    world = spec.world_size
    before = int(k["ckpt_before_kill"])
    res.checks[f"SIGKILL of every rank ({world} of {world}), nothing of the job left"] = (
        kill.signal == "SIGKILL" and kill.ranks_killed == world and not kill.left
    )
    res.checks["no signal caught by the killed ranks (no save-on-signal)"] = (
        k["signal_records"] == 0 and k["requeue_exits"] == 0
    )
    res.checks[f"nothing saved after the kill: latest still {before}, no complete iter dir past it"] = (
        before >= 0
        and ckpt_step == before
        and k["ckpt_records_after_kill"] == 0
        and not k["complete_dirs_past_ckpt"]
    )
    res.checks[f"first new step is N+1 = {ckpt_step + 1}"] = first_new == ckpt_step + 1
    tol = ctx.cfg.workload.resume_loss_rel_tol  # "in line with the pre-kill trajectory", stated
    res.metrics["loss_rel_tol"] = tol
    res.checks[f"loss within {tol:g} of the uninterrupted run"] = m["loss_rel_diff"] <= tol
    res.checks[f"resume <= {t.resume_s_max:g}s"] = m["resume_s"] <= t.resume_s_max
    res.checks["resumed job completed"] = job_finished_ok(st2)
    res.decide(
        f"SIGKILL of every rank ({kill.ranks_killed}/{world}) at step {int(k['at_step'])}, latest still "
        f"{ckpt_step}; checkpoint {ckpt_step} -> first new step {first_new} in {m['resume_s']:.1f}s "
        f"(load {m['load_s']:.2f}s), loss {loss_resumed:.6f} vs {loss_ref:.6f} "
        f"(rel diff {m['loss_rel_diff']:.1e})"
    )
    return _end(ctx, res)


def _end(ctx: StageContext, res: StageResult) -> StageResult:
    res.write(ctx.run_dir)
    ctx.progress.end(res, ctx.run_dir)
    return res
