"""Megatron-LM log events (logevents.py) -> the project's telemetry records (lcm_runner/contracts.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from lcm_runner.contracts import EVENT_CKPT_BEGIN, EVENT_CKPT_END, EVENT_RESUME, EVENT_STEP

from .logevents import (
    CkptLoadBegin,
    CkptLoadEnd,
    CkptSaveBegin,
    CkptSaveEnd,
    Event,
    Iteration,
    NoCheckpoint,
)

# ---------------------------------------------------------------------------------------------------
# Events -> the project's telemetry records (lcm_runner/contracts.py)


@dataclass
class _PendingSave:
    begin: CkptSaveBegin
    asynchronous: bool = False  # an iteration line came between its begin and its end
    resumed_at: float | None = None  # when training went on after it (async), see to_telemetry


def _seconds(end: float | None, start: float | None) -> float | None:
    return round(end - start, 6) if end is not None and start is not None else None


def _resumed_at(it: Iteration, save_iteration: int) -> float | None:
    """When the iterations of `it`'s interval began: its ts minus its iterations' elapsed time."""
    if it.ts is None:
        return None
    n = max(1, it.iteration - save_iteration)
    return it.ts - n * it.step_time_s


@dataclass(frozen=True)
class _FirstLine:
    """A run's first iteration line: Megatron's training_log prints it without resetting its sums."""

    iteration: int
    step_time_s: float
    losses: dict[str, float]


def _unaverage(printed: float, first: float, count: int) -> float:
    """The mean of the last `count - 1` of `count` iterations, from the mean of all and the first's."""
    return (printed * count - first) / (count - 1)


class _Averaging:
    """Undoes the one average over two intervals that Megatron-LM prints after every (re)start.

    training_log (core_v0.19.0 training.py, `should_reset = not is_first_iteration`) logs a run's first
    iteration and keeps its loss sums and interval timer, so the next logged line, at iteration j, prints
    the mean over the first iteration f and f+1..j (j - f + 1 of them) where every other line covers only
    its own interval. The losses and the time of iterations f+1..j are therefore
    (printed x (j - f + 1) - first's) / (j - f). A run starts at the beginning of a log and after every
    checkpoint load or "no checkpoint" line (each start prints one of them before training when --load
    is given, as the runner always gives it). The printed values are kept (`*_printed` fields).
    """

    def __init__(self) -> None:
        self.fresh = True  # the next iteration line is a run's first
        self.first: _FirstLine | None = None

    def restart(self) -> None:
        self.fresh, self.first = True, None

    def correct(self, it: Iteration) -> tuple[float, dict[str, float], bool]:
        """(step time, losses, corrected) of the iterations `it`'s line stands for alone."""
        if self.fresh:
            self.fresh = False
            self.first = _FirstLine(it.iteration, it.step_time_s, dict(it.losses))
            return it.step_time_s, dict(it.losses), False
        first, self.first = self.first, None
        if first is None or it.iteration <= first.iteration:
            return it.step_time_s, dict(it.losses), False
        count = it.iteration - first.iteration + 1
        losses = {
            k: _unaverage(v, first.losses[k], count) if k in first.losses else v for k, v in it.losses.items()
        }
        return _unaverage(it.step_time_s, first.step_time_s, count), losses, True


class TelemetryMapper:
    """One pass over the events, keeping the open saves, the last load begin and the run's first line."""

    def __init__(self, seq_length: int, common: Callable[[float | None, str], dict[str, Any]]) -> None:
        self.seq_length = seq_length
        self.common = common
        self.saves: dict[int, _PendingSave] = {}
        self.load_begin: CkptLoadBegin | None = None
        self.averaging = _Averaging()

    def map(self, event: Event) -> dict[str, Any] | None:
        if isinstance(event, Iteration):
            return self.step(event)
        if isinstance(event, CkptSaveBegin):
            self.saves[event.iteration] = _PendingSave(event)
            return {**self.common(event.ts, EVENT_CKPT_BEGIN), "step": event.iteration, "path": event.path}
        if isinstance(event, CkptSaveEnd):
            return self.ckpt_end(event)
        if isinstance(event, CkptLoadBegin):
            self.load_begin = event
            return None
        if isinstance(event, CkptLoadEnd):
            self.averaging.restart()
            return self.resume(event)
        if isinstance(event, NoCheckpoint):
            self.averaging.restart()
        return None  # scheduled, no checkpoint, exit requested: no record of their own

    def step(self, it: Iteration) -> dict[str, Any]:
        for pending in self.saves.values():
            if not pending.asynchronous:
                pending.asynchronous = True
                pending.resumed_at = _resumed_at(it, pending.begin.iteration)
        step_time, losses, corrected = self.averaging.correct(it)
        tokens = it.global_batch_size * self.seq_length
        rec = {
            **self.common(it.ts, EVENT_STEP),
            "step": it.iteration,
            "loss": losses.get("lm loss", it.loss),
            "step_time_s": step_time,
            "tokens_per_s": tokens / step_time if step_time > 0 else None,
            "skipped_iterations": it.skipped_iterations,
            "nan_iterations": it.nan_iterations,
            "learning_rate": it.learning_rate,
            "loss_scale": it.loss_scale,
            "losses": losses,
        }
        if corrected:
            rec["loss_printed"], rec["step_time_printed_s"] = it.loss, it.step_time_s
        if it.grad_norm is not None:
            rec["grad_norm"] = it.grad_norm
        return rec

    def ckpt_end(self, end: CkptSaveEnd) -> dict[str, Any]:
        pending = self.saves.pop(end.iteration, None)
        begin = pending.begin if pending is not None else None
        total = _seconds(end.ts, begin.ts if begin else None)
        blocking = total
        if pending is not None and pending.asynchronous:
            blocking = _seconds(pending.resumed_at, pending.begin.ts)
        path = end.path if end.path is not None else (begin.path if begin else None)
        return {
            **self.common(end.ts, EVENT_CKPT_END),
            "step": end.iteration,
            "blocking_s": blocking,
            "total_s": total,
            "bytes": None,
            "path": path,
        }

    def resume(self, end: CkptLoadEnd) -> dict[str, Any]:
        begin, self.load_begin = self.load_begin, None
        load_s = _seconds(end.ts, begin.ts) if begin is not None and begin.path == end.path else None
        rec = self.common(end.ts, EVENT_RESUME)
        return {**rec, "step": end.iteration, "load_s": load_s, "path": end.path}


def to_telemetry(
    events: Iterable[Event],
    *,
    seq_length: int,
    rank: int,
    attempt: int,
    job: str,
    now: Callable[[], float] | None = None,
) -> list[dict[str, Any]]:
    """The project's telemetry records (lcm_runner/contracts.py) of Megatron's events, in order.

    - `Iteration` -> step: step, loss ("lm loss", DP-averaged by Megatron; no local_loss), step_time_s,
      tokens_per_s = global_batch_size * seq_length / step_time_s, skipped_iterations, nan_iterations,
      learning_rate, loss_scale, losses (every printed loss), grad_norm (when printed). The second line
      of every run is un-averaged (`_Averaging`), its printed loss and time kept as loss_printed and
      step_time_printed_s.
    - `CkptSaveBegin` -> ckpt_begin: step, path.
    - `CkptSaveEnd` -> ckpt_end: step, total_s = end ts - begin ts; bytes None (not in the log);
      blocking_s: for a synchronous save (no iteration line between its begin and end lines) the same as
      total_s. For an async save (iteration lines between them) training went on once the save was
      scheduled: blocking_s runs from the begin line until the first iteration line after it, less
      that line's elapsed time (`n * step_time_s` for the `n` iterations since the saved one: with
      --log-interval 1, n = 1). Megatron stops its interval timer during the save, so that is when
      training resumed. None where a timestamp is missing or the begin line was not seen.
    - `CkptLoadEnd` -> resume: step (the loaded iteration), load_s = end ts - begin ts when both are
      known (Megatron prints no timestamp there: only with a parser `clock`), path.
    - `CkptSaveScheduled`, `NoCheckpoint`, `ExitRequested`: no record (the exit record's code is the
      process's exit status, which the launcher knows and the log does not).

    Every record has ts (the event's; `now()` (default time.time) where the line had none), event,
    rank, attempt, job.
    """
    clock = now or time.time

    def common(ts: float | None, event: str) -> dict[str, Any]:
        stamp = ts if ts is not None else clock()
        return {"ts": stamp, "event": event, "rank": rank, "attempt": attempt, "job": job}

    mapper = TelemetryMapper(seq_length, common)
    return [rec for ev in events if (rec := mapper.map(ev)) is not None]
