"""Loading a checkpoint: every rank verifies a slice of its files, the newest good one is chosen (damaged
ones rejected and recorded, incomplete newer saves removed), then model, optimizer and RNG are restored.

A mixin of CheckpointManager (checkpoint.py), which provides the directories, the telemetry, the
known-good candidates and the sharded state (ckpt_state.py).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from lcm_runner.ckpt import catalog, integrity
from lcm_runner.ckpt.catalog import CatalogError, complete_steps, read_latest, write_latest_atomically
from lcm_runner.ckpt.integrity import COMPLETE_MARKER
from lcm_runner.contracts import EVENT_CKPT_REJECTED, EVENT_RESUME, LATEST_FILE, iter_dir_name

from . import ckpt_memory, ckpt_shm
from .ckpt_errors import CheckpointError, NoGoodCheckpoint
from .ckpt_state import LEGACY_OPTIMIZER_KEY, CheckpointState
from .distributed import all_agree
from .telemetry import TelemetryWriter


def will_resume(d: Path | None) -> bool:
    """Whether load_latest will load a checkpoint from `d` or raise NoGoodCheckpoint (never start fresh):
    a tracker file or a complete checkpoint is there (see _choose)."""
    return d is not None and d.is_dir() and ((d / LATEST_FILE).exists() or bool(complete_steps(d)))


def _has_legacy_torch_optimizer(path: Path) -> bool:
    """A checkpoint whose torch optimizer state is one pickled object per rank (before 2026-12-03)."""
    from torch.distributed.checkpoint import FileSystemReader

    keys = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    return any(k.startswith(f"{LEGACY_OPTIMIZER_KEY}/") for k in keys)


class CheckpointLoader(CheckpointState):
    load_dir: Path | None
    save_dir: Path | None
    telemetry: TelemetryWriter
    model_initialized: bool
    memory: bool
    _candidates: dict[int, int]

    def _verify(self, path: Path) -> tuple[bool, str, str, bool]:
        """All ranks check a slice of the checkpoint's files each; (ok, file, reason, legacy) everywhere."""
        v = integrity.verify_checkpoint(path, part=self.rank, parts=self.world)
        mine = v.problems[:1]
        found: list[Any] = [None] * self.world
        dist.all_gather_object(found, (mine, v.legacy))
        problems = [p for ps, _ in found for p in ps]
        legacy = any(lg for _, lg in found)
        if problems:
            return False, problems[0][0], problems[0][1], legacy
        return True, "", "", legacy

    def _choose(self) -> tuple[int, Path] | None:
        """The newest checkpoint at or below `latest` that verifies; rejects (and records) the others.
        None: nothing to resume from (a fresh run). Raises NoGoodCheckpoint when checkpoints exist but
        none verifies."""
        d = self.load_dir
        assert d is not None
        problem = ""
        try:
            latest = read_latest(d)
        except (CheckpointError, CatalogError) as e:  # a damaged tracker file: the newest that verifies
            latest, problem = None, str(e)
            if self.rank == 0:
                print(f"lcm-train: {e}: choosing the newest checkpoint that verifies", flush=True)
        complete = complete_steps(d)
        if latest is None and not complete:
            if self.rank == 0 and (incomplete := catalog.iter_steps(d)):
                print(
                    f"lcm-train: {d}: only incomplete checkpoints ({', '.join(map(str, incomplete))}); "
                    "starting from step 0",
                    flush=True,
                )
            if problem:
                raise NoGoodCheckpoint(f"{problem}, and no complete checkpoint in {d}")
            return None
        order = sorted((s for s in complete if latest is None or s <= latest), reverse=True)
        rejected: list[str] = []
        if latest is not None and latest not in order:
            why = "incomplete (no lcm_complete.json)" if (d / iter_dir_name(latest)).is_dir() else "missing"
            if catalog.is_rejected(d / iter_dir_name(latest)):
                why = "rejected earlier"
            rejected.append(f"{iter_dir_name(latest)}: {why}")
            if self.rank == 0:
                print(f"lcm-train: {LATEST_FILE} names step {latest}, which is {why}", flush=True)
        for s in order:
            path = d / iter_dir_name(s)
            ok, file, reason, legacy = self._verify(path)
            if ok:
                self._clean_partials(d, s)
                if legacy and self.rank == 0:
                    print(
                        f"lcm-train: {path.name} has no checksums (written before them): loading unverified"
                    )
                if latest != s:
                    if self.rank == 0:
                        write_latest_atomically(d, s)
                        print(f"lcm-train: falling back to {path.name} (verified); latest now names it")
                    dist.barrier()
                return s, path
            rejected.append(f"{path.name}: {file}: {reason}")
            if self.rank == 0:
                print(f"lcm-train: checkpoint {path} rejected: {file}: {reason}", flush=True)
                catalog.mark_rejected(d, s, file, reason)
            self.telemetry.emit(
                EVENT_CKPT_REJECTED, step=s, path=str(path), file=file, reason=reason, durable=True
            )
        raise NoGoodCheckpoint(f"no checkpoint in {d} verifies: " + "; ".join(rejected))

    def _clean_partials(self, d: Path, chosen: int) -> None:
        """Rank 0: remove the saves newer than the checkpoint being resumed that never completed (a
        writer died, the disk filled): never selectable, and named in one line each."""
        if self.rank != 0:
            return
        for s in catalog.iter_steps(d):
            p = d / iter_dir_name(s)
            if s > chosen and not catalog.is_complete(p):
                writers = sorted(int(f.stem[4:]) for f in (p / integrity.SUMS_DIR).glob("rank*.json"))
                missing = sorted(set(range(self.world)) - set(writers))
                why = f"ranks {missing} never finished writing" if missing else "its marker was never written"
                print(f"lcm-train: {p.name}: an incomplete save ({why}): removed, resuming from {chosen}")
                shutil.rmtree(p, ignore_errors=True)

    def load_latest(
        self, built: Any, load_optim: bool = True, load_rng: bool = True
    ) -> tuple[int, dict[str, Any]]:
        """Verify, then load the newest good checkpoint (model, optimizer, RNG). Returns (step, lcm
        meta); (0, {}) for a fresh run. Raises NoGoodCheckpoint."""
        if self.load_dir is None:
            return 0, {}
        t0 = time.time()
        if self.memory and (got := self._load_from_memory(built, load_optim, load_rng, t0)) is not None:
            return got
        chosen = self._choose()
        if chosen is None:
            if not self.model_initialized:
                raise NoGoodCheckpoint(
                    f"{self.load_dir}: the checkpoint seen at start-up is gone; not training from "
                    "weights that were never initialised"
                )
            return 0, {}
        from megatron.core import dist_checkpointing

        step, path = chosen
        verify_s = time.time() - t0
        legacy = built.optimizer_impl != "megatron" and _has_legacy_torch_optimizer(path)
        template = self._sharded_state(built, step, is_loading=True, meta={}, legacy_optimizer=legacy)
        if not load_optim:
            template.pop("optimizer")
        if not load_rng:
            template.pop("rng_state")
        state = dist_checkpointing.load(template, str(path))
        optim = state.get("optimizer")
        if optim is not None and built.optimizer_impl != "megatron" and not legacy:
            optim = self.torch_optimizer_state_dict(optim)
        self._restore(built, state["model"], optim, state.get("rng_state"))
        load_s = time.time() - t0
        if not catalog.is_known_good(path):
            self._candidates[step] = 0
        self.telemetry.emit(
            EVENT_RESUME,
            step=int(state["iteration"]),
            load_s=round(load_s, 6),
            verify_s=round(verify_s, 6),
            path=str(path),
            source="disk",
        )
        return int(state["iteration"]), dict(state.get("lcm") or {})

    def _restore(self, built: Any, model: Any, optim: Any | None, rng: Any | None) -> None:
        """Model, then optimizer (None: not loaded, megatron's main params re-read from the model), then
        RNG (None: not loaded); every rank together."""
        built.gpt.load_state_dict(model)
        if optim is not None:
            built.optimizer.load_state_dict(optim)
        elif built.optimizer_impl == "megatron":
            built.optimizer.reload_model_params()  # fp32 main params from the loaded bf16 model
        if rng is not None:
            self._set_rng_state(rng)
        if self.device == "cuda":
            torch.cuda.synchronize()
        dist.barrier()

    def _load_from_memory(
        self, built: Any, load_optim: bool, load_rng: bool, t0: float
    ) -> tuple[int, dict[str, Any]] | None:
        """An in-process restart: restore from the host copy of the checkpoint `latest` names when every
        rank holds it (ckpt_memory); None: load from disk."""
        d = self.load_dir
        assert d is not None
        held = ckpt_memory.usable_step()
        try:
            latest = read_latest(d)
        except (CheckpointError, CatalogError):
            latest = None
        path = d / iter_dir_name(held) if held is not None else None
        ok = (
            path is not None
            and d == self.save_dir
            and held == latest
            and catalog.is_complete(path)
            and not catalog.is_rejected(path)
        )
        shared = ckpt_memory.shared()
        if ok and shared:  # a copy a dead predecessor took: of the checkpoint that is on disk now
            snap_digest = ckpt_memory.held_marker()
            ok = snap_digest is not None and snap_digest == ckpt_shm.marker_digest(path / COMPLETE_MARKER)
        if not all_agree(ok, self.device):
            if not shared:
                ckpt_memory.drop()
            return None
        snap = ckpt_memory.take()
        assert snap is not None and path is not None
        s = ckpt_memory.restore_source(snap, self.device)
        self._restore(
            built, s["model"], s["optimizer"] if load_optim else None, s["rng_state"] if load_rng else None
        )
        if not catalog.is_known_good(path):
            self._candidates[snap.step] = 0
        self.telemetry.emit(
            EVENT_RESUME,
            step=snap.step,
            load_s=round(time.time() - t0, 6),
            verify_s=0.0,
            path=str(path),
            source="shm" if shared else "memory",
        )
        if self.rank == 0:
            how = "the shared host copy (a new process)" if shared else "host memory (in-process restart)"
            print(f"lcm-train: restored {path.name} from {how}", flush=True)
        return snap.step, dict(s.get("lcm") or {})
