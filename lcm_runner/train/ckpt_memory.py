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
the next save allocates fresh buffers. A dead process takes its copy with it, unless the agent gave a
shared-memory directory ($LCM_HOST_COPY_DIR, `lcm agent --host-copy`): the buffers are then a mapped
file there (ckpt_shm.py) and a process the agent starts after a kill -9 restores from it (`attach`);
such a copy is not handed over but kept (restoring copies out of it), so a second restart before the next
save finds it too. A requeue (a new agent) loads from disk. Host memory corrupted in place is not
detected here (server memory is ECC); the disk checkpoint of the same step is verified by the next
restart that loads from disk.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from . import ckpt_shm


@dataclass
class Snapshot:
    step: int
    committed: bool
    state: dict[str, Any]  # model, optimizer, rng, meta: host tensors in the structure state_dict() gave
    buffers: list[torch.Tensor]
    marker_sha256: str | None = None  # shm: the checkpoint's lcm_complete.json this copy is of


_held: Snapshot | None = None
# the shared-memory backing ($LCM_HOST_COPY_DIR): where, and the mapped data file of the held buffers
_place: ckpt_shm.Place | None = None
_region: ckpt_shm.Region | None = None
_skeleton: Any = None
_layout: list[tuple[int, str, list[int]]] = []


def configure(place: ckpt_shm.Place | None) -> None:
    """Back the copy by shared memory at `place` (None: this process's memory only)."""
    global _place
    _place = place


def shared() -> bool:
    return _place is not None


def attach(pin: bool) -> int | None:
    """A new process: take up the committed copy a predecessor left at the configured place; its step, or
    None (no copy, another job's, or unreadable)."""
    global _held, _region, _skeleton, _layout
    if _place is None:
        return None
    doc = ckpt_shm.read_manifest(_place)
    if doc is None:
        return None
    try:
        region = ckpt_shm.Region.open(_place.dir / str(doc["data"]), int(doc["size"]), pin)
        layout = [(int(o), str(d), [int(x) for x in sh]) for o, d, sh in doc["layout"]]
        buffers = region.map_views(layout)
        skeleton = ckpt_shm.skeleton_of(doc)
    except (OSError, ValueError, KeyError, TypeError, EOFError, AttributeError, ImportError) as e:
        print(f"lcm-train: host copy in {_place.dir} not usable ({e}): loading from disk", flush=True)
        return None
    _region, _skeleton, _layout = region, skeleton, layout
    state = _map(skeleton, lambda s: buffers[s.index])
    _held = Snapshot(int(doc["step"]), True, state, buffers, doc.get("marker_sha256"))
    return _held.step


def _shm_buffers(tensors: list[torch.Tensor], pin: bool) -> list[torch.Tensor]:
    """Buffers in the shared-memory file: the held file when the layout is the same, else a new one."""
    global _region, _layout
    assert _place is not None
    layout, size = ckpt_shm.layout_of(tensors)
    if _region is not None and layout == _layout and _region.views:
        return _region.views
    old = _region
    _region = ckpt_shm.Region.create(_place, size, pin)
    _layout = layout
    if old is not None:
        old.close(unlink=True)
    ckpt_shm.remove_stale(_place, keep=_region.path)
    return _region.map_views(layout)


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
    global _held, _skeleton
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
    if _place is not None:
        ckpt_shm.invalidate(_place)  # a process that dies during the copy leaves no usable manifest
        _skeleton = skeleton
        try:
            buffers = _shm_buffers(tensors, pin)
        except OSError as e:  # /dev/shm full or gone: this run keeps no shared copy
            print(f"lcm-train: host copy in {_place.dir}: {e}; keeping none for this run", flush=True)
            configure(None)
            return time.time() - t0
    elif same:
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


def commit(step: int, marker: Path | None = None) -> None:
    """Step `step`'s checkpoint is complete on disk (`marker`: its lcm_complete.json): its copy (if it
    is the one held) becomes usable; with shared memory, also to the next process (the manifest)."""
    if _held is not None and _held.step == step:
        _held.committed = True
        if _place is not None and _region is not None and marker is not None:
            _held.marker_sha256 = ckpt_shm.marker_digest(marker)
            ckpt_shm.write_manifest(_place, step, _region, _layout, _skeleton, _held.marker_sha256)


def held_marker() -> str | None:
    """The sha256 of the lcm_complete.json the committed copy is of (shared memory only)."""
    return _held.marker_sha256 if _held is not None and _held.committed else None


def usable_step() -> int | None:
    return _held.step if _held is not None and _held.committed else None


def take() -> Snapshot | None:
    """The committed copy, handed over once (see the module's docstring); None when there is none. A
    shared-memory copy stays held: the caller copies out of it (`restore_source`)."""
    global _held
    if _place is not None:
        return _held if _held is not None and _held.committed else None
    snap, _held = (_held, None) if _held is not None and _held.committed else (None, _held)
    return snap


def restore_source(snap: Snapshot, device: str) -> dict[str, Any]:
    """The state to restore from: on CPU a shared copy is cloned (torch's optimizer would keep the
    mapped tensors as its state, and the next save would overwrite them in place)."""
    if _place is None or device != "cpu":
        return snap.state
    return _map(snap.state, lambda t: t.clone())


def drop() -> None:
    global _held
    _held = None
