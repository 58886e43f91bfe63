"""nccl-profile: rerun a short job with NCCL_DEBUG=INFO, one log per process in <run_dir>/nccl/, and
summarise the logs with the parser (lcm_runner.nccl): network plugin, transports per rank, algorithms
and protocols, warnings, and flags against what the cluster spec expects."""

from __future__ import annotations

from lcm_runner.stages.common import SKIP, JobWatch, StageContext, StageError, StageResult, job_finished_ok

STAGE = "nccl_profile"
PROFILE_STEPS = 10
NCCL_SUBSYS = "INIT,ENV,NET,GRAPH,TUNING,P2P,SHM"  # what prints plugin, transports, algorithms


def profile_env(ctx: StageContext) -> dict[str, str]:
    return {
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": NCCL_SUBSYS,
        "NCCL_DEBUG_FILE": str(ctx.run_dir / "nccl" / "nccl.%h.%p.log"),
    }


def run(ctx: StageContext) -> StageResult:
    from lcm_runner.nccl import profile_dir

    res = StageResult(STAGE)
    ctx.progress.begin(STAGE, ctx.run_dir)
    if not ctx.cfg.uses_gpu:
        return _skip(
            ctx, res, "CPU run (gpus_per_node 0): the ranks talk gloo, NCCL is not used and writes no logs"
        )
    if ctx.cfg.world_size < 2:
        # measured on H200 with Megatron-LM: its communicators initialise, but no collective connects a
        # channel with one rank, so there is no transport, algorithm or path to profile
        return _skip(
            ctx, res, "one rank (world size 1): no NCCL collective connects ranks, nothing to profile"
        )
    nccl_dir = ctx.run_dir / "nccl"
    nccl_dir.mkdir(parents=True, exist_ok=True)
    try:
        spec = ctx.spec(
            "nccl",
            "nccl-profile",
            train_iters=min(PROFILE_STEPS, ctx.cfg.train_iters),
            max_restarts=0,
            env=profile_env(ctx),
        )
        job = ctx.launcher.submit(spec)
        res.job_ids.append(job.id)
        res.event(f"submitted {job.id} with NCCL_DEBUG=INFO", job.submitted)
        st = JobWatch(ctx, job).finish()
    except StageError as e:
        res.checks["job ran"] = False
        res.decide(str(e))
        return _end(ctx, res)
    summary = profile_dir(nccl_dir, ctx.cluster)
    res.metrics.update(summary)
    res.checks["job completed"] = job_finished_ok(st)
    res.checks["NCCL logs written"] = summary["files"] > 0
    res.checks["no error flags"] = bool(summary["ok"])
    errors = [f["detail"] for f in summary["flags"] if f.get("severity") == "error"]
    res.decide(
        f"{summary['files']} logs; plugins {','.join(summary['net_plugins']) or '-'}; transports "
        f"{','.join(summary['transports']) or '-'}; {summary['warnings']} warnings"
        + (f"; {errors[0]}" if errors else "")
    )
    return _end(ctx, res)


def _skip(ctx: StageContext, res: StageResult, why: str) -> StageResult:
    res.verdict = SKIP
    res.summary = why
    return _end(ctx, res)


def _end(ctx: StageContext, res: StageResult) -> StageResult:
    res.write(ctx.run_dir)
    ctx.progress.end(res, ctx.run_dir)
    return res
