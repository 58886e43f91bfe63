"""What every stage shares: the context (config, launcher, run dir), the live follower of a job's
telemetry, the progress printer and the stage result file (`stages/<stage>.json`).

Over ~300 lines: the StageContext and StageResult every stage shares, with the waiting helpers they all use;
each stage is its own module.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from lcm_runner import telemetry
from lcm_runner.config import RunConfig
from lcm_runner.contracts import EVENT_CKPT_END, EVENT_EXIT, EVENT_STEP
from lcm_runner.launch.base import Job, JobSpec, JobState, JobStatus, Launcher
from lcm_runner.launch.jobspec import job_spec
from lcm_runner.telemetry import Record

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
STATUS_POLL_S = 0.25  # job state (squeue/scontrol on Slurm) is asked this often; telemetry every 50 ms


class StageError(RuntimeError):
    """A stage could not go on (job failed to start, a wait timed out); becomes a FAIL verdict."""


# ----------------------------------------------------------------------------- progress


class Progress:
    """One line per thing that happens: which stage, which job, which step, what it waits for."""

    def __init__(self, out: TextIO | None = None, step_every: int = 5) -> None:
        self.out = out or sys.stdout
        self.step_every = step_every
        self.stage = "-"
        self._last_step: dict[str, int] = {}
        self._step_rank: dict[str, int] = {}  # job -> the rank whose steps are printed

    def _print(self, msg: str) -> None:
        stamp = time.strftime("%H:%M:%S", time.gmtime())
        self.out.write(f"{stamp} [{self.stage}] {msg}\n")
        self.out.flush()

    def begin(self, stage: str, run_dir: Path) -> None:
        self.stage = stage
        self._print(f"begin; run dir: {run_dir}")

    def info(self, msg: str) -> None:
        self._print(msg)

    def waiting(self, what: str) -> None:
        self._print(f"waiting for {what}")

    def record(self, rec: Record) -> None:
        """Prints the steps of one rank per job (the lowest seen with steps: rank 0, or Megatron-LM's
        last rank), every `step_every` and the first of an attempt, and rank 0's checkpoints and exits."""
        if rec.event == EVENT_STEP and rec.step is not None:
            if rec.rank > self._step_rank.setdefault(rec.job, rec.rank):
                return
            self._step_rank[rec.job] = rec.rank
            key = f"{rec.job}/{rec.attempt}"
            first = key not in self._last_step
            if first or rec.step % self.step_every == 0:
                loss = rec.get("loss")
                st = rec.get("step_time_s")
                self._print(
                    f"job {rec.job} attempt {rec.attempt} step {rec.step} loss {loss:.4f} "
                    f"step_time {st * 1000:.0f} ms"
                    if isinstance(loss, int | float) and isinstance(st, int | float)
                    else f"job {rec.job} step {rec.step}"
                )
            self._last_step[key] = rec.step
        elif rec.rank != 0:
            return
        elif rec.event in ("ckpt_end", "resume", "exit", "signal"):
            detail = {k: v for k, v in rec.data.items() if k in ("step", "total_s", "load_s", "code", "name")}
            self._print(f"job {rec.job} attempt {rec.attempt} {rec.event} {detail}")

    def end(self, result: StageResult, run_dir: Path) -> None:
        self._print(f"VERDICT {result.verdict}: {result.summary}")
        self._print(f"end; run dir: {run_dir}")


# ----------------------------------------------------------------------------- result


@dataclass
class StageResult:
    stage: str
    verdict: str = FAIL
    summary: str = ""
    started: float = field(default_factory=time.time)
    ended: float = 0.0
    job_ids: list[str] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    checks: dict[str, bool] = field(default_factory=dict)  # each criterion of the verdict

    def event(self, what: str, ts: float | None = None) -> None:
        self.events.append({"ts": ts if ts is not None else time.time(), "what": what})

    def decide(self, summary: str) -> None:
        """PASS when every recorded check holds (at least one), else FAIL naming the failed ones."""
        failed = [k for k, ok in self.checks.items() if not ok]
        self.verdict = PASS if self.checks and not failed else FAIL
        self.summary = summary if not failed else f"{summary}; failed: {', '.join(failed)}"

    def write(self, run_dir: Path) -> Path:
        self.ended = self.ended or time.time()
        path = run_dir / "stages" / f"{self.stage}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(_clean(asdict(self)), indent=2) + "\n", encoding="utf-8")
        tmp.replace(path)
        return path


def _clean(obj: Any) -> Any:
    """JSON has no NaN/inf: such a measurement is reported as null."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clean(v) for v in obj]
    return obj


def read_result(run_dir: Path, stage: str) -> dict[str, Any] | None:
    path = run_dir / "stages" / f"{stage}.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


# ----------------------------------------------------------------------------- context

FOREIGN_NO_HANDLER = "--no-exit-signal-handler"  # the one stage flag a foreign workload understands


@dataclass
class StageContext:
    cfg: RunConfig
    run_dir: Path
    launcher: Launcher
    progress: Progress
    agent: str = "lcm"  # the agent of the stages' own jobs (the fault stage also runs stock torchrun)
    env_file: Path | None = None
    cluster: dict[str, Any] | None = None
    step_sleep_ms: int = 0  # stretches steps so operator actions land mid-run (tiny CPU models)
    hold: tuple[int, str] | None = None  # (step, file): jobs wait before the step while the file exists
    standby_nodes: int = 0  # hot spare agents for the node-loss case (local launcher)
    torchrun_handler_ref: bool = True  # fault: also measure stock torchrun with the exit-signal handler on
    timeout_s: float = 600.0

    def spec(
        self,
        name: str,
        ckpt: str,
        *,
        agent: str | None = None,
        train_iters: int | None = None,
        max_restarts: int | None = None,
        extra_args: list[str] | None = None,
        env: dict[str, str] | None = None,
        standby_nodes: int = 0,
    ) -> JobSpec:
        c = self.cfg
        save = self.fresh_checkpoint_dir(ckpt)
        extra = list(extra_args or [])
        if c.workload.foreign:
            # the stages speak the project trainer's flags; a foreign trainer gets their meaning
            handler = FOREIGN_NO_HANDLER not in extra
            unknown = [a for a in extra if a != FOREIGN_NO_HANDLER]
            if unknown:
                raise StageError(f"{name}: {c.workload.kind} workload cannot take trainer flags {unknown}")
            args = c.to_train_args(
                str(save),
                telemetry_dir=str(self.run_dir / "telemetry"),
                train_iters=train_iters,
                signal_handler=handler,
            )
            extra = []
        else:
            args = c.to_train_args(
                str(save), telemetry_dir=str(self.run_dir / "telemetry"), train_iters=train_iters
            )
            if self.step_sleep_ms:
                args += ["--fault-sleep-ms", str(self.step_sleep_ms)]
            if self.hold:
                args += ["--fault-hold-at-step", str(self.hold[0]), "--fault-hold-file", self.hold[1]]
        return job_spec(
            c,
            name=name,
            run_dir=self.run_dir,
            train_args=args + extra,
            python=c.python if self.launcher.name == "slurm" else sys.executable,
            agent=agent or self.agent,
            max_restarts=max_restarts,
            env=env,
            env_file=self.env_file,
            standby_nodes=standby_nodes,
        )

    def fresh_checkpoint_dir(self, name: str) -> Path:
        """<checkpoints>/<name>, or <name>.2, .3 ... when a stage already ran in this run dir: a job
        must start from nothing (never from an earlier stage's final checkpoint), and nothing is
        deleted."""
        root = self.checkpoint_root()
        path, n = root / name, 1
        while path.exists():
            n += 1
            path = root / f"{name}.{n}"
        path.mkdir(parents=True)
        return path

    def checkpoint_root(self) -> Path:
        return Path(self.cfg.checkpoint_dir) if self.cfg.checkpoint_dir else self.run_dir / "checkpoints"


# ----------------------------------------------------------------------------- following a job


class JobWatch:
    """Tails the run's telemetry for one job's records while checking that the job is still alive."""

    def __init__(self, ctx: StageContext, job: Job) -> None:
        self.ctx = ctx
        self.job = job
        self.records: list[Record] = []
        self._offsets: dict[Path, int] = {}
        self._pending: dict[Path, bytes] = {}
        self.status: JobStatus | None = None

    def poll(self) -> list[Record]:
        new: list[Record] = []
        for path in telemetry.telemetry_files(self.ctx.run_dir):
            off = self._offsets.get(path, 0)
            try:
                with path.open("rb") as fh:
                    fh.seek(off)
                    chunk = fh.read()
            except FileNotFoundError:
                continue
            self._offsets[path] = off + len(chunk)
            *lines, rest = (self._pending.get(path, b"") + chunk).split(b"\n")
            self._pending[path] = rest
            for raw in lines:
                try:
                    rec = telemetry.parse_line(raw.decode("utf-8", "replace"), str(path))
                except telemetry.TelemetryError:
                    continue  # a SIGKILLed writer's partial line
                if rec is not None and rec.job == self.job.id:
                    new.append(rec)
                    self.ctx.progress.record(rec)
        self.records.extend(new)
        return new

    def until(self, predicate: Callable[[Record], bool], what: str, timeout_s: float | None = None) -> Record:
        """The first (new or already seen) record matching; StageError if the job ends or time runs out."""
        for rec in self.records:
            if predicate(rec):
                return rec
        self.ctx.progress.waiting(f"{what} (job {self.job.id})")
        deadline = time.monotonic() + (timeout_s or self.ctx.timeout_s)
        next_status = 0.0
        while time.monotonic() < deadline:
            for rec in self.poll():
                if predicate(rec):
                    return rec
            now = time.monotonic()
            if now < next_status:
                time.sleep(0.05)
                continue
            next_status = now + STATUS_POLL_S
            st = self.ctx.launcher.status(self.job)
            if st.state.finished:
                for rec in self.poll():
                    if predicate(rec):
                        return rec
                self.status = st
                raise StageError(f"job {self.job.id} ended ({st.state.value} {st.reason}) before {what}")
            time.sleep(0.05)
        raise StageError(f"timed out after {timeout_s or self.ctx.timeout_s:.0f}s waiting for {what}")

    def finish(self, timeout_s: float | None = None) -> JobStatus:
        self.ctx.progress.waiting(f"job {self.job.id} to finish")
        deadline = time.monotonic() + (timeout_s or self.ctx.timeout_s)
        st = self.ctx.launcher.status(self.job)
        while not st.state.finished and time.monotonic() < deadline:
            self.poll()
            time.sleep(STATUS_POLL_S)
            st = self.ctx.launcher.status(self.job)
        self.poll()
        if not st.state.finished:
            self.ctx.launcher.cancel(self.job, hard=True)
            raise StageError(f"job {self.job.id} still running after {timeout_s or self.ctx.timeout_s:.0f}s")
        self.status = st
        self.ctx.progress.info(f"job {self.job.id} {st.state.value} {st.exit_codes} {st.reason}")
        return st


def is_step(
    step: int | None = None, min_step: int | None = None, attempt_min: int = 0
) -> Callable[[Record], bool]:
    def pred(r: Record) -> bool:
        if r.event != EVENT_STEP or r.attempt < attempt_min or r.step is None:
            return False
        if step is not None and r.step != step:
            return False
        return min_step is None or r.step >= min_step

    return pred


def is_exit(r: Record) -> bool:
    return r.event == EVENT_EXIT


# ----------------------------------------------------------------------------- numbers


def losses_by_step(records: list[Record], attempt_min: int = 0, after_ts: float = 0.0) -> dict[int, float]:
    """The reporting rank's loss per step (`telemetry.step_rank`: rank 0, or the last rank for
    Megatron-LM); the last record of a step wins: a re-run step replaces the killed one."""
    out: dict[int, float] = {}
    for r in telemetry.reporting_steps(records):
        if r.attempt >= attempt_min and r.ts > after_ts and isinstance(r.get("loss"), int | float):
            out[int(r.step or 0)] = float(r.get("loss"))
    return out


def last_save_before(records: list[Record], ts: float) -> int:
    """The step of the last checkpoint rank 0 completed before `ts` (-1 when none did): what a recovery
    from a kill at `ts` must resume from (rank 0 ends a save once `latest` names it)."""
    ends = [int(r.step or 0) for r in records if r.event == EVENT_CKPT_END and r.rank == 0 and r.ts < ts]
    return max(ends, default=-1)


def rel_diff(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def max_rel_diff(got: dict[int, float], ref: dict[int, float]) -> tuple[float, int]:
    """Largest relative difference over the steps both have, and how many steps were compared."""
    common = sorted(set(got) & set(ref))
    if not common:
        return math.nan, 0
    return max(rel_diff(got[s], ref[s]) for s in common), len(common)


def p99(values: list[float]) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


def cv(values: list[float]) -> float:
    if len(values) < 2:
        return math.nan
    mean = statistics.fmean(values)
    return statistics.pstdev(values) / mean if mean else math.nan


def job_finished_ok(st: JobStatus | None) -> bool:
    return st is not None and st.state == JobState.COMPLETED


def reference_losses(ctx: StageContext) -> dict[int, float]:
    """The uninterrupted run's losses: the baseline stage's job in this run dir (empty if none)."""
    base = read_result(ctx.run_dir, "baseline")
    if not base or not base.get("job_ids"):
        return {}
    job = str(base["job_ids"][0])
    return losses_by_step([r for r in telemetry.load_run(ctx.run_dir) if r.job == job])
