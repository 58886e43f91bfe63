"""all: baseline, resume, fault, nccl-profile, then the report: the whole sequence in one run directory,
each stage ending with its one-line verdict, and a closing table of all of them (the CLI renders
train_2node.sbatch and nccl_env.sh into the run directory first when given the cluster spec). With the
Slurm launcher, the jobs' accounting cross-check (stages/accounting.py: sacct against the jobs' logs;
SKIP where accounting is not configured) runs after the stages, so the report lists it."""

from __future__ import annotations

from collections.abc import Callable

from lcm_runner.stages import accounting, baseline, fault, nccl_profile, resume
from lcm_runner.stages.common import FAIL, StageContext, StageResult

SEQUENCE: list[tuple[str, Callable[[StageContext], StageResult]]] = [
    ("baseline", baseline.run),
    ("resume", resume.run),
    ("fault", fault.run),
    ("nccl_profile", nccl_profile.run),
]


def run_report(ctx: StageContext) -> str:
    """The report (lcm_runner.report): infra_slo.md, slo.json, multi_node_run.log, plots; its verdict."""
    try:
        from lcm_runner.report import build_report

        return build_report(ctx.run_dir, ctx.cfg)
    except Exception as e:  # e.g. matplotlib missing on the controller: the stage files are written
        return f"{FAIL}: the report could not be written: {type(e).__name__}: {e}"


def run(ctx: StageContext, only: list[str] | None = None) -> tuple[list[StageResult], str]:
    results: list[StageResult] = []
    for name, fn in SEQUENCE:
        if only and name not in only:
            continue
        results.append(fn(ctx))
    if ctx.launcher.name == "slurm":
        results.append(accounting.run(ctx))
    ctx.progress.stage = "all"
    report = run_report(ctx)
    ctx.progress.info(f"report: {report}")
    ctx.progress.info("summary:")
    for r in results:
        ctx.progress.info(f"  {r.stage:<13} {r.verdict:<4} {r.summary}")
    ctx.progress.info(f"run dir: {ctx.run_dir}")
    return results, report


def exit_code(results: list[StageResult], report: str = "") -> int:
    """1 when a stage FAILed or the report's SLO verdict is FAIL, else 0."""
    return 1 if any(r.verdict == FAIL for r in results) or report.startswith(FAIL) else 0
