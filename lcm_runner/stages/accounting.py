"""accounting: the runner's record of its Slurm jobs cross-checked against Slurm accounting (sacct).

The runner's record is each job's batch log, `<run_dir>/logs/slurm-<job>.out` (train.sbatch.j2, one file
per job, appended by every run of it): a `job <id> (restart <n>) on <nodes>, ...` line when a run starts,
`agents finished: exit <rc>` when its agents end, `requeue: exit <rc> (...)` when the script requeues it.
For every job, sacct (`--duplicates`: one allocation record per run) must agree:

- runs and requeues: as many runs as the log shows, the last run's SLURM_RESTART_COUNT = sacct's runs - 1;
- nodes: each run on the nodes the log names;
- exit: a run the script ended (`agents finished`, no requeue) has that exit code in sacct
  (`<rc>:0`, COMPLETED exactly when rc is 0; agents killed by signal N, exit 128+N, when a stage killed
  the job: `N:0`, as Slurm records the batch shell killed with them); a run the script requeued is
  REQUEUED, exit 0:0; a run slurmctld requeued (a lost node) is REQUEUED or NODE_FAIL.

Where accounting is not configured (AccountingStorageType none), or the jobs did not run under Slurm,
it says so and the verdict is SKIP: never a FAIL. Writes `stages/accounting.json` (the report lists it
with the other stages) and sacct's own output to `accounting/sacct.txt`.

    lcm-runner accounting --run-dir runs/<run>        (on a host where sacct and scontrol work)
"""

from __future__ import annotations

import argparse
import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lcm_runner.launch.sacct import (
    NO_ACCOUNTING,
    JobAccount,
    SacctError,
    accounting_storage,
    job_accounts,
    parse_sacct,
    sacct_argv,
)
from lcm_runner.stages.common import FAIL, SKIP, StageResult

STAGE = "accounting"
RUN_START = re.compile(r"^job (\S+) \(restart (\d+)\) on (\S+?),? master ")
AGENTS_EXIT = re.compile(r"^agents finished: exit (\d+)")
REQUEUE = re.compile(r"^requeue: exit (\d+)")
LOG_NAME = re.compile(r"^slurm-(\d+(?:_\d+)?)\.out$")
REQUEUED_STATES = ("REQUEUED", "NODE_FAIL", "PREEMPTED")

RunCmd = Callable[[list[str]], str]


@dataclass
class RunnerRun:
    """One run of a job as its batch log records it."""

    restart: int
    nodes: str
    agents_exit: int | None = None
    requeued: bool = False  # the script requeued the job after this run (scontrol requeue)


@dataclass
class RunnerJob:
    job_id: str
    runs: list[RunnerRun] = field(default_factory=list)


@dataclass
class JobCheck:
    job_id: str
    checks: dict[str, bool] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def agrees(self) -> bool:
        return all(self.checks.values())


def parse_job_log(text: str, job_id: str) -> RunnerJob:
    """The runs of job_id in its batch log (lines of other jobs, if any, are ignored)."""
    job = RunnerJob(job_id)
    for line in text.splitlines():
        line = line.strip()
        if m := RUN_START.match(line):
            if m.group(1) == job_id:
                job.runs.append(RunnerRun(int(m.group(2)), m.group(3)))
            continue
        if not job.runs:
            continue
        if m := AGENTS_EXIT.match(line):
            job.runs[-1].agents_exit = int(m.group(1))
        elif REQUEUE.match(line):
            job.runs[-1].requeued = True
    return job


def runner_jobs(run_dir: Path) -> dict[str, RunnerJob]:
    """Every Slurm job of the run directory: logs/slurm-<id>.out, by job id (numeric order)."""
    logs = run_dir / "logs"
    found = {}
    for path in sorted(logs.glob("slurm-*.out")) if logs.is_dir() else []:
        if m := LOG_NAME.match(path.name):
            found[m.group(1)] = parse_job_log(path.read_text(encoding="utf-8", errors="replace"), m.group(1))
    return dict(sorted(found.items(), key=lambda kv: [int(p) for p in kv[0].split("_")]))


def cross_check(runner: RunnerJob, acct: JobAccount | None) -> JobCheck:
    """What the runner's log and sacct say about one job, and each point on which they must agree."""
    c = JobCheck(runner.job_id)
    c.facts["runner_runs"] = len(runner.runs)
    c.facts["runner_restarts"] = runner.runs[-1].restart if runner.runs else None
    if acct is None or not acct.runs:
        c.checks["in sacct"] = False
        c.facts["why"] = f"sacct has no record of job {runner.job_id}"
        return c
    c.facts.update(
        sacct_runs=len(acct.runs),
        sacct_restarts=acct.restarts,
        sacct_states=[r.state for r in acct.runs],
        sacct_exit=[r.exit for r in acct.runs],
        sacct_nodes=[r.nodes for r in acct.runs],
        runner_nodes=[r.nodes for r in runner.runs],
        runner_exit=[r.agents_exit for r in runner.runs],
    )
    c.checks["in sacct"] = True
    c.checks["runs"] = len(runner.runs) == len(acct.runs)
    if runner.runs:
        c.checks["restarts"] = runner.runs[-1].restart == acct.restarts
    for i, (mine, theirs) in enumerate(zip(runner.runs, acct.runs, strict=False)):
        c.checks[f"run {i} nodes"] = mine.nodes == theirs.nodes
        if mine.requeued or i < len(acct.runs) - 1:
            # an earlier run was requeued: by the script (exit 0:0) or by slurmctld (a lost node)
            ok = theirs.state in REQUEUED_STATES and (not mine.requeued or theirs.exit == "0:0")
            c.checks[f"run {i} requeued"] = ok
        elif mine.agents_exit is not None:
            rc = mine.agents_exit
            allowed = {(rc, 0)}
            if rc > 128:
                # the agents were killed by signal rc-128 (a stage's hard kill takes the batch shell too):
                # Slurm records the job as that signal's number (9:0 on the lab's 22.05), or the script's rc
                allowed |= {(rc - 128, 0), (0, rc - 128)}
            c.checks[f"run {i} exit"] = (theirs.exit_code, theirs.exit_signal) in allowed
            c.checks[f"run {i} state"] = theirs.state == ("COMPLETED" if rc == 0 else "FAILED")
        else:
            c.facts.setdefault("notes", []).append(
                f"run {i}: ended without the script's exit line (stopped by the stage); sacct: "
                f"{theirs.state} {theirs.exit}"
            )
    return c


def _run(argv: list[str]) -> str:
    p = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if p.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv[:3])} failed ({p.returncode}): {(p.stderr or p.stdout).strip()[-300:]}"
        )
    return p.stdout


def _sacct_until_ended(job_ids: list[str], run: RunCmd, wait_s: float) -> tuple[str, dict[str, JobAccount]]:
    """sacct of the jobs, asked again (bounded) while a job is still running or its end not yet recorded
    (slurmctld sends a job's end to slurmdbd after the job is gone from squeue)."""
    deadline = time.monotonic() + wait_s
    while True:
        text = run(sacct_argv(job_ids))
        accounts = job_accounts(parse_sacct(text))
        if all(j in accounts and accounts[j].ended for j in job_ids) or time.monotonic() >= deadline:
            return text, accounts
        time.sleep(2.0)


def check_run(
    run_dir: Path, launcher: str = "slurm", run: RunCmd = _run, wait_s: float = 60.0
) -> StageResult:
    """The accounting cross-check of run_dir's Slurm jobs (StageResult, not yet written)."""
    res = StageResult(STAGE)
    jobs = runner_jobs(run_dir)
    res.job_ids = list(jobs)

    def skip(why: str) -> StageResult:
        res.verdict, res.summary = SKIP, why
        res.metrics["skipped"] = why
        return res

    if launcher != "slurm":
        return skip(f"the jobs ran under the {launcher} launcher, not Slurm: no accounting to compare")
    if not jobs:
        return skip(f"no Slurm job logs in {run_dir / 'logs'} (slurm-<job>.out)")
    try:
        storage = accounting_storage(run)
    except (OSError, RuntimeError) as exc:
        return skip(f"Slurm's configuration is not readable here ({exc}): accounting not compared")
    res.metrics["accounting_storage"] = storage
    if storage in NO_ACCOUNTING:
        return skip(
            f"Slurm accounting is not configured (AccountingStorageType {storage or 'unset'}; "
            "cluster.slurm.accounting, docs/scheduler.md#accounting): sacct has nothing to compare"
        )
    try:
        text, accounts = _sacct_until_ended(list(jobs), run, wait_s)
    except (OSError, RuntimeError, SacctError) as exc:
        res.verdict, res.summary = FAIL, f"sacct failed although accounting is {storage}: {exc}"
        return res
    out = run_dir / "accounting"
    out.mkdir(parents=True, exist_ok=True)
    (out / "sacct.txt").write_text(text, encoding="utf-8")
    checked = [cross_check(jobs[j], accounts.get(j)) for j in jobs]
    res.metrics["jobs"] = {c.job_id: {**c.facts, "checks": c.checks, "agrees": c.agrees} for c in checked}
    for c in checked:
        for name, ok in c.checks.items():
            res.checks[f"job {c.job_id}: {name}"] = ok
    requeues = sum(int(c.facts.get("sacct_restarts") or 0) for c in checked)
    bad = [c.job_id for c in checked if not c.agrees]
    res.decide(
        f"{len(checked)} job(s), {requeues} requeue(s): sacct and the runner's logs "
        + ("agree" if not bad else f"disagree on job(s) {', '.join(bad)}")
    )
    return res


def run(ctx: Any) -> StageResult:
    """As a step of `lcm-runner all` (after the stages, before the report)."""
    ctx.progress.begin(STAGE, ctx.run_dir)
    res = check_run(ctx.run_dir, ctx.launcher.name)
    res.write(ctx.run_dir)
    ctx.progress.end(res, ctx.run_dir)
    return res


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "accounting",
        help="cross-check a run's Slurm jobs (logs/slurm-<job>.out) against sacct; SKIP without accounting",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--run-dir", required=True, help="the run directory (holding logs/slurm-<job>.out)")
    p.add_argument(
        "--wait", type=float, default=60.0, help="seconds to wait for sacct to record the jobs' end"
    )
    p.set_defaults(func=run_cli)
    return p


def run_cli(ns: argparse.Namespace) -> int:
    run_dir = Path(ns.run_dir)
    if not run_dir.is_dir():
        print(f"lcm-runner accounting: {run_dir} is not a directory")
        return 2
    res = check_run(run_dir, wait_s=ns.wait)
    path = res.write(run_dir)
    print(f"VERDICT accounting: {res.verdict}: {res.summary} ({path})")
    return 1 if res.verdict == FAIL else 0


__all__ = [
    "JobCheck",
    "RunnerJob",
    "RunnerRun",
    "check_run",
    "cross_check",
    "parse_job_log",
    "runner_jobs",
]
