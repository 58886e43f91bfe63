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


# Storage errors: the save cannot succeed by retrying it elsewhere (the run stops, ExitCode.CKPT_SAVE_FAILED).
_STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EACCES, errno.EPERM})
# What a collective in the save reports when a peer rank or its node is gone (gloo, NCCL, the c10d store).
_COMM_MARKERS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "gloo/transport",
    "NCCL error",
    "ProcessGroupNCCL",
    "DistNetworkError",
    "DistStoreError",
)


def is_comm_failure(exc: BaseException) -> bool:
    """A save that failed because a peer went away (a rank or node lost mid-save), not because of the
    storage: the run restarts from the last good checkpoint like after any lost peer, instead of stopping
    with CKPT_SAVE_FAILED (seen on the lab: a node cut off during a save ended its peers with "Connection
    closed by peer" inside the save, exit 80, and the job was not requeued)."""
    chain = _chain(exc)
    if any(isinstance(c, OSError) and c.errno in _STORAGE_ERRNOS for c in chain):
        return False
    for cur in chain:
        if any(
            cls.__name__ in ("DistError", "DistNetworkError", "DistStoreError") for cls in type(cur).__mro__
        ):
            return True
        try:
            text = str(cur)
        except Exception:  # an exception whose own message cannot be formatted says nothing either way
            continue
        if any(m in text for m in _COMM_MARKERS):
            return True
    return False


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
