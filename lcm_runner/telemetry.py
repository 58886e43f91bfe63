"""Reading the trainer's telemetry: `<run_dir>/telemetry/rank<R>.jsonl` (see lcm_runner/contracts.py).

Used after the fact by the report (`load_run`) and live by the stages (`follow`). The files are
append-only JSON Lines written by running (and sometimes SIGKILLed) processes, so a reader must
expect a truncated last line, and a line where a killed writer's partial record was followed by a
restarted writer's record. Such lines are skipped and counted, never guessed at.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lcm_runner.contracts import EVENT_STEP, TELEMETRY_DIR

log = logging.getLogger(__name__)

COMMON_FIELDS = ("ts", "event", "rank", "attempt", "job")


class TelemetryError(ValueError):
    """A telemetry file or record that does not follow the contract."""


@dataclass(frozen=True)
class Record:
    """One telemetry record: the common fields, plus the event's own fields in `data`."""

    ts: float
    event: str
    rank: int
    attempt: int
    job: str
    data: dict[str, Any] = field(default_factory=dict)
    source: str = ""  # "<file>:<line>", for error messages

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    @property
    def step(self) -> int | None:
        value = self.data.get("step")
        return int(value) if value is not None else None

    @classmethod
    def from_dict(cls, obj: Any, source: str = "") -> Record:
        if not isinstance(obj, dict):
            raise TelemetryError(f"{source}: a record must be a JSON object, got {type(obj).__name__}")
        missing = [k for k in COMMON_FIELDS if k not in obj]
        if missing:
            raise TelemetryError(f"{source}: record lacks {', '.join(missing)}")
        try:
            ts = float(obj["ts"])
            rank = int(obj["rank"])
            attempt = int(obj["attempt"])
        except (TypeError, ValueError) as exc:
            raise TelemetryError(f"{source}: ts/rank/attempt must be numbers: {exc}") from exc
        if not isinstance(obj["event"], str) or not obj["event"]:
            raise TelemetryError(f"{source}: event must be a non-empty string")
        data = {k: v for k, v in obj.items() if k not in COMMON_FIELDS}
        return cls(ts, obj["event"], rank, attempt, str(obj["job"]), data, source)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ts": self.ts,
            "event": self.event,
            "rank": self.rank,
            "attempt": self.attempt,
            "job": self.job,
            **self.data,
        }


@dataclass
class ParseStats:
    """Lines skipped while reading (truncated writes of killed processes), per file."""

    skipped: dict[str, int] = field(default_factory=dict)

    @property
    def total_skipped(self) -> int:
        return sum(self.skipped.values())


def telemetry_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / TELEMETRY_DIR


def telemetry_files(run_dir: str | Path) -> list[Path]:
    """The rank files of a run, ordered by rank number."""
    d = telemetry_dir(run_dir)
    if not d.is_dir():
        return []

    def rank_of(p: Path) -> int:
        digits = p.stem.removeprefix("rank")
        return int(digits) if digits.isdigit() else 1 << 30

    return sorted(d.glob("rank*.jsonl"), key=lambda p: (rank_of(p), p.name))


def parse_line(line: str, source: str) -> Record | None:
    """A record from one line; None for a blank line; TelemetryError for a malformed one."""
    text = line.strip()
    if not text:
        return None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TelemetryError(f"{source}: not JSON ({exc.msg})") from exc
    return Record.from_dict(obj, source)


def read_file(path: Path, stats: ParseStats | None = None, strict: bool = False) -> list[Record]:
    records: list[Record] = []
    with path.open(encoding="utf-8", errors="replace") as fh:
        for lineno, line in enumerate(fh, 1):
            try:
                rec = parse_line(line, f"{path}:{lineno}")
            except TelemetryError:
                if strict:
                    raise
                log.warning("skipping malformed telemetry line %s:%d", path, lineno)
                if stats is not None:
                    stats.skipped[str(path)] = stats.skipped.get(str(path), 0) + 1
                continue
            if rec is not None:
                records.append(rec)
    return records


def load_run(run_dir: str | Path, strict: bool = False, stats: ParseStats | None = None) -> list[Record]:
    """All records of a run, every rank, ordered by (ts, rank).

    A missing telemetry directory gives an empty list (a stage that never ran wrote nothing);
    malformed lines are skipped (and counted in `stats`) unless `strict`.
    """
    records: list[Record] = []
    for path in telemetry_files(run_dir):
        records.extend(read_file(path, stats, strict))
    records.sort(key=lambda r: (r.ts, r.rank))
    return records


def of_event(records: Iterable[Record], event: str, rank: int | None = None) -> list[Record]:
    return [r for r in records if r.event == event and (rank is None or r.rank == rank)]


def steps(records: Iterable[Record], rank: int | None = None) -> list[Record]:
    """Step records (of one rank, or all), ordered by time."""
    return sorted(of_event(records, EVENT_STEP, rank), key=lambda r: (r.ts, r.rank))


def step_rank(records: Iterable[Record]) -> int:
    """The rank whose step records the stages read: the lowest rank that wrote any (0 when none).

    The project's trainer writes steps from every rank and rank 0 is read; Megatron-LM prints its
    iteration line on the last rank only (`print_rank_last`), so a megatron-lm workload's steps come from
    rank world_size - 1 (its checkpoint lines from rank 0, `print_rank_0`).
    """
    return min((r.rank for r in records if r.event == EVENT_STEP), default=0)


def reporting_steps(records: Iterable[Record]) -> list[Record]:
    """The step records of the reporting rank (`step_rank`), ordered by time."""
    recs = list(records)
    return steps(recs, step_rank(recs))


def first_step_after(records: Iterable[Record], ts: float, rank: int | None = None) -> Record | None:
    """The first step record whose ts is strictly after `ts` (any rank unless given)."""
    for rec in steps(records, rank):
        if rec.ts > ts:
            return rec
    return None


def ranks(records: Iterable[Record]) -> list[int]:
    return sorted({r.rank for r in records})


def job_ids(records: Iterable[Record]) -> list[str]:
    seen: dict[str, None] = {}
    for r in records:
        seen.setdefault(r.job, None)
    return list(seen)


class _Tail:
    """Incremental reader of one append-only file: only complete lines are consumed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.lineno = 0
        self.pending = b""

    def read_new(self) -> Iterator[Record]:
        try:
            with self.path.open("rb") as fh:
                size = fh.seek(0, 2)
                if size < self.offset:  # truncated/replaced: start over
                    self.offset, self.lineno, self.pending = 0, 0, b""
                fh.seek(self.offset)
                chunk = fh.read()
        except FileNotFoundError:
            return
        self.offset += len(chunk)
        data = self.pending + chunk
        *lines, self.pending = data.split(b"\n")
        for raw in lines:
            self.lineno += 1
            try:
                rec = parse_line(raw.decode("utf-8", errors="replace"), f"{self.path}:{self.lineno}")
            except TelemetryError:
                log.warning("skipping malformed telemetry line %s:%d", self.path, self.lineno)
                continue
            if rec is not None:
                yield rec


def follow(
    run_dir: str | Path,
    predicate: Callable[[Record], bool],
    timeout_s: float,
    poll_s: float = 0.25,
    from_start: bool = True,
    on_record: Callable[[Record], None] | None = None,
) -> Record | None:
    """Tail every rank file of `run_dir` (including ones created later) until a record matches.

    Returns the first matching record, or None when `timeout_s` passes first. With
    `from_start=False` only records appended after the call are considered. `on_record` sees every
    new record (the stages print progress from it).
    """
    deadline = time.monotonic() + timeout_s
    tails: dict[Path, _Tail] = {}
    first_scan = True
    while True:
        for path in telemetry_files(run_dir):
            if path not in tails:
                tail = _Tail(path)
                if first_scan and not from_start:
                    tail.offset = path.stat().st_size
                tails[path] = tail
        first_scan = False
        for tail in tails.values():
            for rec in tail.read_new():
                if on_record is not None:
                    on_record(rec)
                if predicate(rec):
                    return rec
        if time.monotonic() >= deadline:
            return None
        time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))


def exit_code(records: Iterable[Record], job: str, since: float = 0.0) -> int | None:
    """The trainer's verdict for a job from its `exit` records since `since` (None: no exit recorded).

    REQUEUE wins (the ranks only exit with it after a complete, collectively agreed checkpoint);
    otherwise the highest code recorded.
    """
    from lcm_runner.contracts import EVENT_EXIT, ExitCode

    codes = [int(r.get("code", 1)) for r in of_event(records, EVENT_EXIT) if r.job == job and r.ts >= since]
    if not codes:
        return None
    return int(ExitCode.REQUEUE) if int(ExitCode.REQUEUE) in codes else max(codes)


def main(argv: list[str] | None = None) -> int:
    """`python -m lcm_runner.telemetry exit-code RUN_DIR --job J [--since TS]`: prints the code, if any.

    Used by the batch script on each node after a stock torchrun agent returns (torchrun reports 1
    whatever its workers exited with).
    """
    import argparse

    ap = argparse.ArgumentParser(prog="python -m lcm_runner.telemetry")
    sub = ap.add_subparsers(dest="command", required=True)
    ec = sub.add_parser("exit-code", help="the trainer's exit code for a job, from its telemetry")
    ec.add_argument("run_dir")
    ec.add_argument("--job", required=True)
    ec.add_argument("--since", type=float, default=0.0, help="unix time; ignore older records")
    ns = ap.parse_args(argv)
    code = exit_code(load_run(ns.run_dir), ns.job, ns.since)
    if code is not None:
        print(code)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
