"""The host copy of the last checkpoint in shared memory, so that it outlives the process that took it.

ckpt_memory keeps the copy in the process's own memory: an in-process restart finds it, a new process
does not. When the agent gives its ranks a directory (`lcm agent --host-copy`: a fresh directory on
/dev/shm in $LCM_HOST_COPY_DIR, removed when the agent exits) the copy's bytes live in a file there,
mapped into the trainer, and each committed copy is described by a manifest beside it. A rank the agent
starts after its predecessor died (kill -9, a segfault, the OOM killer) maps that file and restores from
it instead of verifying and reading the checkpoint on disk.

    $LCM_HOST_COPY_DIR/rank<R>/data.<n>        the tensors, each at a 4 KiB-aligned offset (one file per
                                               layout: reused from save to save)
    $LCM_HOST_COPY_DIR/rank<R>/manifest.json   step, the data file, each tensor's offset/dtype/shape, the
                                               state's structure (pickled), the identity of the job and
                                               the sha256 of the checkpoint's lcm_complete.json

Nothing is usable between the start of a capture and its commit: the manifest is removed before the
buffers are overwritten and written (atomically, by rename) only once the checkpoint of that step is
complete on disk. A copy of another job, rank or world size, or of a checkpoint whose marker is not the
one on disk now, is never used. The data file is allocated in full up front (posix_fallocate): a full
/dev/shm is an error at the save (the copy is then dropped for the run), never a SIGBUS later.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import mmap
import os
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

ENV = "LCM_HOST_COPY_DIR"
MANIFEST = "manifest.json"
ALIGN = 4096
FORMAT = 1


@dataclass(frozen=True)
class Place:
    dir: Path  # <LCM_HOST_COPY_DIR>/rank<R>
    ident: dict[str, Any]  # whose copy it is: a copy of anything else is not used


def place_from_env(rank: int, ident: dict[str, Any]) -> Place | None:
    root = os.environ.get(ENV)
    if not root:
        return None
    return Place(Path(root) / f"rank{rank}", {**ident, "rank": rank})


def marker_digest(path: Path) -> str | None:
    """sha256 of a file (the checkpoint's lcm_complete.json), None when unreadable."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def layout_of(tensors: list[torch.Tensor]) -> tuple[list[tuple[int, str, list[int]]], int]:
    """Each tensor's (offset, dtype name, shape) in one data file, and the file's size."""
    out, off = [], 0
    for t in tensors:
        out.append((off, str(t.dtype).removeprefix("torch."), list(t.shape)))
        off += -(-(t.numel() * t.element_size()) // ALIGN) * ALIGN
    return out, max(off, ALIGN)


def _dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"not a torch dtype: {name}")
    return dt


@dataclass
class Region:
    """One data file mapped into this process (and registered with CUDA when pinned)."""

    path: Path
    size: int
    mm: mmap.mmap
    base: torch.Tensor
    registered: bool = False
    views: list[torch.Tensor] = field(default_factory=list)

    @classmethod
    def create(cls, place: Place, size: int, pin: bool) -> Region:
        place.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        taken = [int(p.suffix[1:]) for p in place.dir.glob("data.*") if p.suffix[1:].isdigit()]
        n = 1 + max(taken, default=0)
        path = place.dir / f"data.{n}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.posix_fallocate(fd, 0, size)  # ENOSPC now, not SIGBUS at the first write
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        os.close(fd)
        return cls._mapped(path, size, mm, pin)

    @classmethod
    def open(cls, path: Path, size: int, pin: bool) -> Region:
        with open(path, "r+b") as f:
            if os.fstat(f.fileno()).st_size != size:
                raise ValueError(f"{path}: size {os.fstat(f.fileno()).st_size}, the manifest says {size}")
            mm = mmap.mmap(f.fileno(), size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        return cls._mapped(path, size, mm, pin)

    @classmethod
    def _mapped(cls, path: Path, size: int, mm: mmap.mmap, pin: bool) -> Region:
        base = torch.frombuffer(mm, dtype=torch.uint8)
        region = cls(path, size, mm, base)
        if pin and torch.cuda.is_available():
            # page-locked for the device: the save's device-to-host copy and the restore run at full speed
            # (unregistered, the copies are synchronous through pageable memory: slower, still correct)
            try:
                err = torch.cuda.cudart().cudaHostRegister(base.data_ptr(), size, 0)
                region.registered = int(err) == 0
            except (AttributeError, RuntimeError, TypeError):
                region.registered = False
        return region

    def map_views(self, layout: list[tuple[int, str, list[int]]]) -> list[torch.Tensor]:
        out = []
        for off, name, shape in layout:
            dt = _dtype(name)
            n = 1
            for d in shape:
                n *= int(d)
            nbytes = n * torch.empty((), dtype=dt).element_size()
            if off + nbytes > self.size:
                raise ValueError(f"{self.path}: a tensor at {off} + {nbytes} runs past {self.size} bytes")
            out.append(self.base[off : off + nbytes].view(dt).view(shape))
        self.views = out
        return out

    def close(self, unlink: bool) -> None:
        """Unmap (when nothing else holds the views) and, with `unlink`, remove the file."""
        if self.registered:
            with contextlib.suppress(Exception):
                torch.cuda.cudart().cudaHostUnregister(self.base.data_ptr())
            self.registered = False
        self.views = []
        self.base = torch.empty(0, dtype=torch.uint8)
        with contextlib.suppress(BufferError):  # views still alive elsewhere: the mapping stays
            self.mm.close()
        if unlink:
            self.path.unlink(missing_ok=True)


def invalidate(place: Place) -> None:
    """Before the buffers are overwritten: no manifest, so nothing half-written is ever used."""
    with contextlib.suppress(FileNotFoundError):
        (place.dir / MANIFEST).unlink()


def write_manifest(
    place: Place,
    step: int,
    region: Region,
    layout: list[tuple[int, str, list[int]]],
    skeleton: Any,
    digest: str | None,
) -> None:
    doc = {
        "format": FORMAT,
        "step": step,
        "ident": place.ident,
        "data": region.path.name,
        "size": region.size,
        "layout": layout,
        "marker_sha256": digest,
        "skeleton": base64.b64encode(pickle.dumps(skeleton)).decode(),
    }
    tmp = place.dir / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(doc), encoding="utf-8")
    os.replace(tmp, place.dir / MANIFEST)


def read_manifest(place: Place) -> dict[str, Any] | None:
    """The committed copy's manifest when it is this job's and rank's; None otherwise."""
    try:
        doc = json.loads((place.dir / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("ident") != place.ident:
        return None
    return doc


def skeleton_of(doc: dict[str, Any]) -> Any:
    # our own 0700 directory, written by this rank's predecessor (the trust of a torch.load of the checkpoint)
    return pickle.loads(base64.b64decode(doc["skeleton"]))


def remove_stale(place: Place, keep: Path | None) -> None:
    """Data files of earlier layouts (a mapping still held elsewhere stays valid after the unlink)."""
    for p in place.dir.glob("data.*"):
        if keep is None or p != keep:
            p.unlink(missing_ok=True)
