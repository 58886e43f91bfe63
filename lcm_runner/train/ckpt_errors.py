"""Checkpoint failures: the exception types, one line for an exception chain, and the save-crash fault."""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path

from lcm_runner.contracts import ExitCode


class CheckpointError(RuntimeError):
    pass


try:  # torch's CheckpointException derives from BaseException, not Exception
    from torch.distributed.checkpoint.api import CheckpointException as _CheckpointBaseException
except ImportError:  # pragma: no cover
    _CheckpointBaseException = RuntimeError  # type: ignore[assignment,misc]


class CheckpointSaveFailed(CheckpointError):
    """A save that did not complete (ENOSPC, I/O error, a rank's writer failed): `latest` unchanged."""

    def __init__(self, step: int, path: Path, cause: str):
        super().__init__(f"checkpoint {path.name} failed: {cause}")
        self.step, self.path, self.cause = step, path, cause


class NoGoodCheckpoint(CheckpointError):
    """Checkpoints exist but none verifies: the trainer stops (ExitCode.NO_GOOD_CHECKPOINT)."""


def _chain(exc: BaseException) -> list[BaseException]:
    """The exception, its causes/contexts, and the per-rank failures a CheckpointException wraps."""
    out: list[BaseException] = []
    todo = [exc]
    while todo:
        cur = todo.pop(0)
        if cur is None or any(cur is o for o in out):
            continue
        out.append(cur)
        todo += [c for c in (cur.__cause__, cur.__context__) if c is not None]
        failures = getattr(cur, "failures", None)
        if isinstance(failures, dict):
            todo += [f[0] if isinstance(f, tuple) else f for f in failures.values()]
    return [e for e in out if isinstance(e, BaseException)]


def describe_cause(exc: BaseException) -> str:
    """One line for an exception chain: the OS error (with its errno name) where there is one."""
    for cur in _chain(exc):
        if isinstance(cur, OSError) and cur.errno:
            name = errno.errorcode.get(cur.errno, str(cur.errno))
            where = f" ({cur.filename})" if cur.filename else ""
            return f"{cur.strerror} [{name}]{where}"
    text = str(exc)
    for code, name in ((errno.ENOSPC, "ENOSPC"), (errno.EDQUOT, "EDQUOT"), (errno.EIO, "EIO")):
        if os.strerror(code) in text:
            return f"{os.strerror(code)} [{name}]"
    first = text.strip().splitlines()[0] if text.strip() else ""
    return f"{type(exc).__name__}: {first}"[:300]


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


@dataclass
class Fault:
    """--fault-crash-in-save: hard-exit `rank` once its shards of `step` are written, before completion."""

    crash_step: int = 0
    crash_rank: int = 0

    def maybe_crash(self, step: int, rank: int) -> None:
        if self.crash_step and step == self.crash_step and rank == self.crash_rank:
            print(f"[rank{rank}] fault injection: crash during the save of step {step}", flush=True)
            os._exit(int(ExitCode.FAILURE))
