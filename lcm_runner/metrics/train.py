"""Training metrics of one node's ranks, from their telemetry (docs/monitoring.md, "Training metrics").

`TrainCollector.poll()` reads what the rank files gained since the last poll (lcm_runner.metrics.follow)
and folds each record of this job into the state of its (rank, attempt); `families()` turns that state
into the contract's metric families.

Which ranks are this node's: a rank belongs to the host its newest `start` record (of this job) names;
a requeued or restarted rank that lands elsewhere moves to that node's writer. Every rank file is read
(the records of a rank's earlier attempts on other hosts still give its restart count, its baseline and
its last checkpoint), only this node's ranks are published.

Which attempt is published: a rank's current one (that of its newest `start`). An earlier attempt's
series disappear when a newer one starts (Prometheus marks them stale at the next scrape), so a graph
by rank never shows a frozen line of a dead process. What spans attempts:
  - `lcm_train_restarts`: the rank's `start` records in this job minus 1;
  - `lcm_train_step_seconds_baseline`: the median step time of the 6th..25th step records of attempt 0
    (for a fresh run: steps 6..25; for a job that resumed from a checkpoint, the same warm-up skipped),
    published on every later attempt's series;
  - the last-checkpoint gauges (`..._last_checkpoint_*`, `lcm_train_checkpoint_{duration,blocking}_seconds`,
    `lcm_train_checkpoint_bytes`): the rank's newest completed save in this job, whichever attempt made
    it (an attempt resumed from that save has not saved yet; its checkpoint is not younger for that).
Counters (`*_total`, the histogram) are the current attempt's: a new process starts them at 0 (a
counter reset, as Prometheus expects when a process restarts).

An attempt number can repeat within a job (TORCHELASTIC_RESTART_COUNT + SLURM_RESTART_COUNT: an
in-place restart of the first run and the first requeue both give 1): every `start` begins a new
attempt state, replacing one of the same number.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lcm_runner.contracts import (
    EVENT_CKPT_END,
    EVENT_CKPT_REJECTED,
    EVENT_EXIT,
    EVENT_NONFINITE,
    EVENT_START,
    EVENT_STEP,
    FATAL_EXIT_CODES,
    ExitCode,
)
from lcm_runner.telemetry import Record, telemetry_files

from .exposition import Histogram, MetricFamily, MetricType
from .follow import Tail

STEP_BUCKETS: tuple[float, ...] = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120)
BASELINE_FIRST, BASELINE_LAST = 6, 25  # step records of attempt 0 whose median is the baseline
# (telemetry field, `collective` label) of the per-collective communication times of a step record
COLLECTIVES = (("comm_grad_reduce_s", "grad_reduce"), ("comm_loss_allreduce_s", "loss_allreduce"))
INFO_FIELDS = ("local_rank", "gpu", "world_size", "tp", "pp", "ep", "dp")  # lcm_train_rank_info labels
# Rank exit codes after which no process of this rank starts again in this run of the batch script
# (the agent restarts in place only after other failures): done, requeue requested, or fatal.
FINAL_EXIT_CODES = frozenset({int(ExitCode.OK), int(ExitCode.REQUEUE), *FATAL_EXIT_CODES})


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


@dataclass
class CheckpointInfo:
    step: int
    ts: float
    total_s: float | None
    blocking_s: float | None
    bytes: int | None


@dataclass
class AttemptState:
    """One process of one rank: from its `start` record to its `exit` record (if it wrote one)."""

    attempt: int
    host: str
    started_ts: float
    info: dict[str, str] = field(default_factory=dict)
    exit_code: int | None = None
    steps: int = 0
    last_step: int | None = None
    last_step_ts: float | None = None
    step_time_s: float | None = None
    loss: float | None = None
    local_loss: float | None = None
    tokens_per_s: float | None = None
    comm_time_s: float | None = None
    step_hist: Histogram = field(default_factory=lambda: Histogram({}, STEP_BUCKETS))
    comm_total: dict[str, float] = field(default_factory=dict)
    ckpt_bytes_total: int = 0
    nonfinite: int = 0
    rejected: int = 0

    @property
    def exited(self) -> bool:
        return self.exit_code is not None


@dataclass
class RankState:
    rank: int
    starts: int = 0
    current: AttemptState | None = None
    attempts: dict[int, AttemptState] = field(default_factory=dict)
    baseline_samples: list[float] = field(default_factory=list)
    attempt0_steps: int = 0
    baseline: float | None = None
    last_ckpt: CheckpointInfo | None = None

    @property
    def host(self) -> str:
        return self.current.host if self.current is not None else ""


class TrainCollector:
    """The state of a job's ranks from their telemetry; publishes the ranks of `host`."""

    def __init__(self, run_dir: str | Path, job_id: str, host: str) -> None:
        self.run_dir = Path(run_dir)
        self.job_id = str(job_id)
        self.host = host
        self.ranks: dict[int, RankState] = {}
        self.tails: dict[Path, Tail] = {}
        self.starts_seen = 0  # `start` records of this job on this host, for the end-of-job check

    # ---- reading ---------------------------------------------------------------------------------
    def poll(self) -> int:
        """Read every rank file's new complete lines; returns the number of records applied."""
        n = 0
        for path in telemetry_files(self.run_dir):
            tail = self.tails.get(path)
            if tail is None:
                tail = self.tails[path] = Tail(path)
            forget, records = tail.read_new()
            for rank in forget:
                self.ranks.pop(rank, None)
            for rec in records:
                n += self.apply(rec)
        return n

    @property
    def skipped_lines(self) -> int:
        return sum(t.state.skipped for t in self.tails.values())

    def apply(self, rec: Record) -> int:
        """Fold one record into its rank's state; 0 when it is another job's (ignored)."""
        if rec.job != self.job_id:
            return 0
        rs = self.ranks.get(rec.rank)
        if rs is None:
            rs = self.ranks[rec.rank] = RankState(rec.rank)
        if rec.event == EVENT_START:
            self._start(rs, rec)
            return 1
        att = rs.attempts.get(rec.attempt)
        if att is None:
            # its `start` line was lost (a damaged line): keep the rank's last known host
            att = AttemptState(rec.attempt, rs.host, rec.ts)
            rs.attempts[rec.attempt] = att
            if rs.current is None or rec.attempt > rs.current.attempt:
                rs.current = att
        if rec.event == EVENT_STEP:
            self._step(rs, att, rec)
        elif rec.event == EVENT_CKPT_END:
            step = rec.step
            if step is not None:
                nbytes = _num(rec.get("bytes"))
                rs.last_ckpt = CheckpointInfo(
                    step, rec.ts, _num(rec.get("total_s")), _num(rec.get("blocking_s")),
                    int(nbytes) if nbytes is not None else None,
                )  # fmt: skip
                att.ckpt_bytes_total += int(nbytes or 0)
        elif rec.event == EVENT_NONFINITE:
            att.nonfinite += 1
        elif rec.event == EVENT_CKPT_REJECTED:
            att.rejected += 1
        elif rec.event == EVENT_EXIT:
            code = _num(rec.get("code"))
            att.exit_code = int(code) if code is not None else int(ExitCode.FAILURE)
        return 1

    def _start(self, rs: RankState, rec: Record) -> None:
        info: dict[str, str] = {}
        for k in INFO_FIELDS:
            v = rec.get(k)
            if v is not None and v != "":
                info[k] = str(v)
        att = AttemptState(rec.attempt, str(rec.get("host") or ""), rec.ts, info)
        rs.attempts[rec.attempt] = att
        rs.current = att
        rs.starts += 1
        if att.host == self.host:
            self.starts_seen += 1

    def _step(self, rs: RankState, att: AttemptState, rec: Record) -> None:
        att.steps += 1
        att.last_step = rec.step
        att.last_step_ts = rec.ts
        dt = _num(rec.get("step_time_s"))
        att.step_time_s = dt
        att.loss = _num(rec.get("loss"))
        att.local_loss = _num(rec.get("local_loss"))
        att.tokens_per_s = _num(rec.get("tokens_per_s"))
        att.comm_time_s = _num(rec.get("comm_time_s"))
        if dt is not None and math.isfinite(dt) and dt >= 0:
            att.step_hist.observe(dt)
        for key, collective in COLLECTIVES:
            t = _num(rec.get(key))
            if t is not None and math.isfinite(t):
                att.comm_total[collective] = att.comm_total.get(collective, 0.0) + t
        per = rec.get(
            "comm"
        )  # seconds per collective (lcm_runner/train/comm.py): "fwd-bwd:ep.all_to_all_single"
        if isinstance(per, dict):
            for collective, value in per.items():
                t = _num(value)
                if t is not None and math.isfinite(t):
                    att.comm_total[str(collective)] = att.comm_total.get(str(collective), 0.0) + t
        if att.attempt == 0 and rs.baseline is None:
            rs.attempt0_steps += 1
            if BASELINE_FIRST <= rs.attempt0_steps <= BASELINE_LAST and dt is not None:
                rs.baseline_samples.append(dt)
            if rs.attempt0_steps == BASELINE_LAST and rs.baseline_samples:
                rs.baseline = statistics.median(rs.baseline_samples)

    # ---- this node -------------------------------------------------------------------------------
    def local_ranks(self) -> list[RankState]:
        return [rs for _, rs in sorted(self.ranks.items()) if rs.current is not None and rs.host == self.host]

    def all_exited(self) -> tuple[bool, bool]:
        """(every rank of this node has exited, and each with a final code): False while none is known."""
        mine = self.local_ranks()
        if not mine:
            return False, False
        cur = [rs.current for rs in mine if rs.current is not None]
        done = all(a.exited for a in cur)
        return done, done and all(a.exit_code in FINAL_EXIT_CODES for a in cur)

    # ---- metric families -------------------------------------------------------------------------
    def families(self, now: float, alive: bool = True) -> list[MetricFamily]:
        return build_families(self.job_id, self.local_ranks(), now, alive)


def _fam(name: str, mtype: MetricType, help_text: str) -> MetricFamily:
    return MetricFamily(name, mtype, help_text)


def build_families(job_id: str, ranks: Iterable[RankState], now: float, alive: bool) -> list[MetricFamily]:
    f = {
        "running": _fam(
            "lcm_train_running", "gauge", "1 while the rank's writer is alive and the rank has not exited"
        ),
        "heartbeat": _fam(
            "lcm_train_writer_heartbeat_timestamp_seconds", "gauge", "Last write of this node's file"
        ),
        "last_step": _fam("lcm_train_last_step", "gauge", "Last completed step"),
        "last_step_ts": _fam(
            "lcm_train_last_step_timestamp_seconds", "gauge", "Wall time of the last completed step"
        ),
        "step_s": _fam("lcm_train_step_seconds", "gauge", "Duration of the last step"),
        "hist": _fam("lcm_train_step_duration_seconds", "histogram", "Step durations of this attempt"),
        "step_total": _fam(
            "lcm_train_step_seconds_total", "counter", "Sum of the step durations of this attempt"
        ),
        "baseline": _fam(
            "lcm_train_step_seconds_baseline",
            "gauge",
            "Median step time of steps 6..25 of attempt 0 (the 6th..25th steps of a resumed job)",
        ),
        "loss": _fam("lcm_train_loss", "gauge", "Last step's global (DP-averaged) loss"),
        "local_loss": _fam(
            "lcm_train_local_loss", "gauge", "Last step's loss of this rank's own micro-batches"
        ),
        "tps": _fam("lcm_train_tokens_per_second", "gauge", "Tokens per second of the last step"),
        "comm_total": _fam(
            "lcm_train_comm_seconds_total", "counter", "Time in timed collectives of this attempt"
        ),
        "comm_frac": _fam(
            "lcm_train_comm_fraction", "gauge", "Communication time / step time of the last step"
        ),
        "ckpt_dur": _fam("lcm_train_checkpoint_duration_seconds", "gauge", "Last save, total seconds"),
        "ckpt_block": _fam(
            "lcm_train_checkpoint_blocking_seconds", "gauge", "Last save, seconds the step loop was blocked"
        ),
        "ckpt_bytes": _fam("lcm_train_checkpoint_bytes", "gauge", "Last save's bytes"),
        "ckpt_bytes_total": _fam(
            "lcm_train_checkpoint_bytes_total", "counter", "Bytes saved by this attempt"
        ),
        "ckpt_step": _fam("lcm_train_last_checkpoint_step", "gauge", "Step of the last completed save"),
        "ckpt_ts": _fam(
            "lcm_train_last_checkpoint_timestamp_seconds", "gauge", "Wall time the last save completed"
        ),
        "restarts": _fam("lcm_train_restarts", "gauge", "Process starts of this rank in this job minus 1"),
        "nonfinite": _fam(
            "lcm_train_nonfinite_steps_total",
            "counter",
            "Steps skipped for a non-finite loss or gradient by this attempt",
        ),
        "rejected": _fam(
            "lcm_train_checkpoints_rejected_total",
            "counter",
            "Checkpoints that failed verification at load in this attempt",
        ),
        "info": _fam(
            "lcm_train_rank_info", "gauge", "1: the rank's place (local rank, physical GPU, parallelism)"
        ),
    }
    f["heartbeat"].add(now, job_id=job_id)
    for rs in ranks:
        att = rs.current
        if att is None:
            continue
        lab = {"job_id": job_id, "rank": str(rs.rank), "attempt": str(att.attempt)}
        f["running"].add(1 if alive and not att.exited else 0, **lab)
        f["restarts"].add(max(0, rs.starts - 1), job_id=job_id, rank=str(rs.rank))
        f["info"].add(1, **lab, **att.info)
        if att.last_step is not None:
            f["last_step"].add(att.last_step, **lab)
        if att.last_step_ts is not None:
            f["last_step_ts"].add(att.last_step_ts, **lab)
        if att.step_time_s is not None:
            f["step_s"].add(att.step_time_s, **lab)
        hist = Histogram(dict(lab), STEP_BUCKETS, list(att.step_hist.counts), att.step_hist.sum)
        hist.count = att.step_hist.count
        f["hist"].samples.append(hist)
        f["step_total"].add(att.step_hist.sum, **lab)
        if rs.baseline is not None:
            f["baseline"].add(rs.baseline, **lab)
        if att.loss is not None:
            f["loss"].add(att.loss, **lab)
        if att.local_loss is not None:
            f["local_loss"].add(att.local_loss, **lab)
        if att.tokens_per_s is not None:
            f["tps"].add(att.tokens_per_s, **lab)
        for collective in sorted(att.comm_total):
            f["comm_total"].add(att.comm_total[collective], **lab, collective=collective)
        if att.comm_time_s is not None and att.step_time_s:
            f["comm_frac"].add(att.comm_time_s / att.step_time_s, **lab)
        ck = rs.last_ckpt
        if ck is not None:
            if ck.total_s is not None:
                f["ckpt_dur"].add(ck.total_s, **lab)
            if ck.blocking_s is not None:
                f["ckpt_block"].add(ck.blocking_s, **lab)
            if ck.bytes is not None:
                f["ckpt_bytes"].add(ck.bytes, **lab)
            f["ckpt_step"].add(ck.step, **lab)
            f["ckpt_ts"].add(ck.ts, **lab)
        f["ckpt_bytes_total"].add(att.ckpt_bytes_total, **lab)
        f["nonfinite"].add(att.nonfinite, **lab)
        f["rejected"].add(att.rejected, **lab)
    return list(f.values())
