"""Trainer-side telemetry writer: <run_dir>/telemetry/rank<R>.jsonl, one JSON object a line.

Every record carries ts, event, rank, attempt, job (lcm_runner.contracts). Lines are appended and
flushed (and fsynced for the rare events) so that a SIGKILL loses at most the line being written.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from lcm_runner.contracts import telemetry_file_name


def attempt_from_env(env: dict[str, str] | os._Environ[str] = os.environ) -> int:
    """Restart count: torchrun's TORCHELASTIC_RESTART_COUNT plus Slurm's SLURM_RESTART_COUNT (requeues)."""
    return int(env.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) + int(
        env.get("SLURM_RESTART_COUNT", "0") or 0
    )


def job_from_env(env: dict[str, str] | os._Environ[str] = os.environ) -> str:
    return env.get("SLURM_JOB_ID") or env.get("TORCHELASTIC_RUN_ID") or env.get("LCM_RUN_ID") or "local"


@dataclass
class TelemetryWriter:
    directory: Path
    rank: int
    attempt: int
    job: str
    _fh: TextIO | None = None
    _writing: bool = False
    _deferred: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / telemetry_file_name(self.rank)
        self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the run

    def _record(self, event: str, data: dict[str, Any]) -> dict[str, Any]:
        rec = {"ts": time.time(), "event": event, "rank": self.rank, "attempt": self.attempt, "job": self.job}
        rec.update(data)
        return rec

    def _write(self, rec: dict[str, Any], durable: bool) -> None:
        assert self._fh is not None
        self._fh.write(json.dumps(rec, separators=(",", ":")) + "\n")
        self._fh.flush()
        if durable:
            os.fsync(self._fh.fileno())

    def emit(self, event: str, durable: bool = False, **data: Any) -> dict[str, Any]:
        rec = self._record(event, data)
        if self._fh is None:  # closed: a late signal during shutdown; nothing to append to
            return rec
        self._writing = True
        try:
            self._write(rec, durable)
            while self._deferred:  # records of signals that arrived while a write was under way
                self._write(self._deferred.pop(0), durable=True)
        finally:
            self._writing = False
        return rec

    def emit_from_signal_handler(self, event: str, **data: Any) -> dict[str, Any]:
        """emit() for a signal handler: the handler runs between two bytecodes of the main thread, which
        may be inside a write to the same buffered file (a nested write raises `reentrant call`, which
        ended a rank mid-step); then the record is kept and written by that write's emit() as it ends."""
        rec = self._record(event, data)
        if self._writing or self._fh is None:
            if self._fh is not None:
                self._deferred.append(rec)
            return rec
        return self.emit(event, durable=True, **data)

    def close(self) -> None:
        if self._fh is not None:
            self._writing = True  # a signal now: nothing more to append to
            self._fh.close()
            self._fh = None
