"""A host-memory copy of the last checkpoint, for NVRx's in-process restart (`--inprocess-restart`).

A fault that in-process restart handles (an exception on some rank, a hang) leaves the processes alive,
and with them their host memory: this module's copy outlives the training function's iteration. At every
save the state the checkpoint writes (model, optimizer, RNG, the lcm meta) is also copied to host memory
(pinned on CUDA; the buffers are reused from save to save). Once that checkpoint is complete on disk (its
marker and `latest` written) the copy is marked as that step's (`commit`). On re-entry, when every rank
holds the committed copy of the step `latest` names (one all-reduce), the trainer restores from it instead
of verifying and reading the files (ckpt_load.CheckpointLoader.load_latest). Anything else (a rank without
a copy, a copy of another step, a save that failed after the copy was taken, `latest` changed on disk)
loads from disk, as any restart does.

The copy is used once: restoring hands its tensors to the optimizer (on CPU it keeps them as its own), so
the next save allocates fresh buffers. A dead process takes its copy with it: process restarts (the agent,
a requeue) always load from disk. Host memory corrupted in place is not detected here (server memory is
ECC); the disk checkpoint of the same step is verified by the next process restart.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Snapshot:
    step: int
    committed: bool
    state: dict[str, Any]  # model, optimizer, rng, meta: host tensors in the structure state_dict() gave
    buffers: list[torch.Tensor]


_held: Snapshot | None = None


class _Slot:
    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index


def _map(obj: Any, fn: Callable[[Any], Any]) -> Any:
    """Rebuild dicts, lists and tuples, applying `fn` to tensors and _Slots; other leaves deep-copied."""
    if isinstance(obj, (torch.Tensor, _Slot)):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: _map(v, fn) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_map(v, fn) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_map(v, fn) for v in obj)
    return copy.deepcopy(obj)


def capture(step: int, state: dict[str, Any], pin: bool) -> float:
    """Copy `state` (tensors on any device) to host memory as step `step`'s, not yet committed. Reuses the
    held buffers when the tensors have the same shapes and dtypes. Returns the seconds it took."""
    global _held
    import time

    t0 = time.time()
    tensors: list[torch.Tensor] = []

    def slot(t: torch.Tensor) -> _Slot:
        tensors.append(t.detach())
        return _Slot(len(tensors) - 1)

    skeleton = _map(state, slot)
    old = _held.buffers if _held is not None else []
    same = len(old) == len(tensors) and all(
        b.shape == t.shape and b.dtype == t.dtype for b, t in zip(old, tensors, strict=True)
    )
    _held = None  # from here until the copy is done, nothing is usable
    if same:
        buffers = old
    else:
        pin = pin and torch.cuda.is_available()
        buffers = [torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=pin) for t in tensors]
    for b, t in zip(buffers, tensors, strict=True):
        b.copy_(t, non_blocking=t.is_cuda and b.is_pinned())
    if any(t.is_cuda for t in tensors):
        torch.cuda.synchronize()
    _held = Snapshot(step, False, _map(skeleton, lambda s: buffers[s.index]), buffers)
    return time.time() - t0


def commit(step: int) -> None:
    """Step `step`'s checkpoint is complete on disk: its copy (if it is the one held) becomes usable."""
    if _held is not None and _held.step == step:
        _held.committed = True


def usable_step() -> int | None:
    return _held.step if _held is not None and _held.committed else None


def take() -> Snapshot | None:
    """The committed copy, handed over once (see the module's docstring); None when there is none."""
    global _held
    snap, _held = (_held, None) if _held is not None and _held.committed else (None, _held)
    return snap


def drop() -> None:
    global _held
    _held = None
