"""all: render, baseline, resume, fault, nccl-profile, then the report: the whole sequence in one run
directory, each stage ending with its one-line verdict, and a closing table of all of them."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from lcm_runner.stages import baseline, fault, nccl_profile, resume
from lcm_runner.stages.common import FAIL, SKIP, StageContext, StageResult

SEQUENCE: list[tuple[str, Callable[[StageContext], StageResult]]] = [
    ("baseline", baseline.run),
    ("resume", resume.run),
    ("fault", fault.run),
    ("nccl_profile", nccl_profile.run),
]


def run_report(ctx: StageContext) -> str:
    """C's report (lcm_runner.report) over the run dir: infra_slo.md, slo.json, plots. Its verdict line."""
    try:
        report = importlib.import_module("lcm_runner.report")
    except ImportError as e:
        return f"{SKIP}: lcm_runner.report is not installed ({e})"
    fn = getattr(report, "build_report", None) or getattr(report, "run_report", None)
    if fn is None:
        return f"{SKIP}: lcm_runner.report has no build_report(run_dir, cfg)"
    out = fn(ctx.run_dir, ctx.cfg)
    return str(out if out is not None else "written")


def run(ctx: StageContext, only: list[str] | None = None) -> list[StageResult]:
    results: list[StageResult] = []
    for name, fn in SEQUENCE:
        if only and name not in only:
            continue
        results.append(fn(ctx))
    ctx.progress.stage = "all"
    ctx.progress.info("report: " + run_report(ctx))
    ctx.progress.info("summary:")
    for r in results:
        ctx.progress.info(f"  {r.stage:<13} {r.verdict:<4} {r.summary}")
    ctx.progress.info(f"run dir: {ctx.run_dir}")
    return results


def exit_code(results: list[StageResult]) -> int:
    return 1 if any(r.verdict == FAIL for r in results) else 0
