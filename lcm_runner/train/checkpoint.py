"""Checkpoints in Megatron-LM's layout through megatron `dist_checkpointing`.

    <save>/iter_0000010/            one torch_dist shard file set per rank + metadata (dist_checkpointing)
    <save>/iter_0000010/lcm_complete.json   written after every rank verified its shards
    <save>/latest_checkpointed_iteration.txt  "10", replaced atomically after lcm_complete.json

The state saved: model (sharded tensors, reshardable), optimizer (megatron's sharded optimizer state, or
a per-rank torch AdamW state object), iteration, per-rank RNG states. The data position is the step: the
token stream is a function of (seed, step, dp rank), see data.py.

Async save (`--async-save`): the shards are written by a forked process (dist_checkpointing's "mcore"
async strategy through AsyncCallsQueue); the step loop only pays for the state-dict preparation and the
fork (`blocking_s`). Completion (verify -> marker -> latest -> prune -> ckpt_end) runs when all ranks'
writers are done, polled after every step. `latest` never names a checkpoint that is not complete.

This module saves (and tracks known-good checkpoints); by concern the rest is in ckpt_state.py (the
sharded state, RNG), ckpt_load.py (verify, choose, load) and ckpt_errors.py (failures, the save-crash
fault). The names callers use are importable from here.
"""

from __future__ import annotations

import errno
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch.distributed as dist

from lcm_runner.ckpt import catalog, integrity
from lcm_runner.ckpt.catalog import complete_steps, read_latest, write_latest_atomically
from lcm_runner.ckpt.integrity import COMPLETE_MARKER, IntegrityError
from lcm_runner.contracts import (
    EVENT_CKPT_BEGIN,
    EVENT_CKPT_END,
    EVENT_CKPT_FAILED,
    EVENT_CKPT_GOOD,
    iter_dir_name,
)

from . import ckpt_memory, ckpt_shm
from .ckpt_errors import (
    CheckpointError,
    CheckpointSaveFailed,
    Fault,
    NoGoodCheckpoint,
    _CheckpointBaseException,
    describe_cause,
    dir_bytes,
    is_comm_failure,
)
from .ckpt_load import CheckpointLoader
from .distributed import all_agree
from .telemetry import TelemetryWriter

__all__ = [
    "COMPLETE_MARKER",
    "CheckpointError",
    "CheckpointManager",
    "CheckpointSaveFailed",
    "Fault",
    "NoGoodCheckpoint",
    "complete_steps",
    "describe_cause",
    "dir_bytes",
    "read_latest",
    "write_latest_atomically",
]


@dataclass
class CheckpointManager(CheckpointLoader):
    save_dir: Path | None
    load_dir: Path | None
    keep_last: int
    async_save: bool
    telemetry: TelemetryWriter
    device: str
    fault: Fault = field(default_factory=Fault)
    good_after_steps: int = 5  # healthy steps after a checkpoint that make it known-good
    algorithm: str = integrity.DEFAULT_ALGORITHM
    writers: int = 1  # writer threads per rank, one shard file each (torch_dist thread_count)
    async_strategy: str = "mcore"  # mcore: a forked writer per save; nvrx: NVRx's persistent worker
    model_initialized: bool = True  # False: the weights were not drawn (a load must follow, or a stop)
    memory: bool = False  # keep a host copy of the last checkpoint for in-process restarts (ckpt_memory)
    _queue: Any = None
    _strategy: Any = None
    _pending: dict[int, tuple[float, bool]] = field(default_factory=dict)
    _in_flight: int | None = None
    _candidates: dict[int, int] = field(default_factory=dict)  # checkpoint step -> healthy steps since
    _memory_s: float = 0.0  # the last save's copy to host memory (memory=True)

    def __post_init__(self) -> None:
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self._attach_host_copy()
        if self.save_dir is not None:
            from .procutil import install_checkpoint_results_queue

            install_checkpoint_results_queue()
        if self.save_dir is not None:
            from megatron.core.dist_checkpointing.strategies.torch import TorchDistSaveShardedStrategy

            # one strategy for the run: it caches nothing between saves unless asked to (cached_metadata)
            self._strategy = TorchDistSaveShardedStrategy("torch_dist", 1, thread_count=self.writers)
        if self.async_save and self.async_strategy == "nvrx":
            from nvidia_resiliency_ext.checkpointing.async_ckpt.core import AsyncCallsQueue as NvrxQueue

            self._queue = NvrxQueue(persistent=True)
        elif self.async_save:
            from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue

            self._queue = AsyncCallsQueue(persistent=False)

    def _attach_host_copy(self) -> None:
        """Under `lcm agent --host-copy` ($LCM_HOST_COPY_DIR): keep the host copy in shared memory, and
        take up the one a predecessor of this rank left (ckpt_memory.attach; used by load_latest when
        every rank holds a copy of the checkpoint `latest` names)."""
        if self.save_dir is None:
            return
        place = ckpt_shm.place_from_env(
            self.rank, {"save": str(self.save_dir.resolve()), "world": self.world}
        )
        if place is None:
            return
        self.memory = True
        ckpt_memory.configure(place)
        ckpt_memory.attach(pin=self.device == "cuda")

    # ---- collectives of small values -----------------------------------------------------------
    def _all_ok(self, ok: bool) -> bool:
        return all_agree(ok, self.device)

    def _from_rank0(self, value: Any) -> Any:
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    # ---- save ----------------------------------------------------------------------------------
    def save(self, built: Any, step: int, meta: dict[str, Any], force_sync: bool = False) -> None:
        """Save step `step`. Returns once the blocking part is done (async) or everything is (sync).
        Raises CheckpointSaveFailed (on every rank) when the save cannot complete."""
        from megatron.core import dist_checkpointing

        assert self.save_dir is not None
        self.finalize(blocking=True)  # at most one save in flight
        path = self.save_dir / iter_dir_name(step)
        t0 = time.time()
        self.telemetry.emit(EVENT_CKPT_BEGIN, step=step, path=str(path), durable=True)
        problem = ""
        if self.rank == 0:
            try:
                if path.exists():  # a leftover of a crashed or rejected save of the same step
                    if read_latest(self.save_dir) == step:
                        raise CheckpointError(f"{path} is the checkpoint latest names: not overwriting it")
                    shutil.rmtree(path)
                path.mkdir(parents=True)
            except (OSError, CheckpointError) as e:
                problem = describe_cause(e)
        problem = self._from_rank0(problem)
        if problem:
            self._fail(step, path, problem)
        state = self._sharded_state(built, step, is_loading=False, meta=meta)
        if self.memory:
            self._memory_s = ckpt_memory.capture(step, self._memory_state(built, meta), self.device == "cuda")
        use_async = self.async_save and not force_sync
        self._in_flight = step
        try:
            req = dist_checkpointing.save(
                state,
                str(path),
                sharded_strategy=self._strategy,
                async_sharded_save=True,
                async_strategy=self.async_strategy if use_async else "mcore",
            )
            req = req._replace(
                async_fn=integrity.HashingWriter(req.async_fn, path, self.rank, self.algorithm)
            )
            if use_async:
                req.finalize_fns.append(lambda: self._complete(step, path, t0))
                self._queue.schedule_async_request(req)
                self._pending[step] = (time.time() - t0, True)
                return
            req.execute_sync()  # the same writer function in this process, then the finalize fns
        except CheckpointSaveFailed:
            raise
        except (Exception, _CheckpointBaseException) as e:
            self._fail(step, path, self._cause(e, path), comm=is_comm_failure(e), exc=e)
        self._pending[step] = (time.time() - t0, False)
        self._complete(step, path, t0)

    def finalize(self, blocking: bool = False) -> None:
        """Complete finished async saves (all ranks must call it at the same points)."""
        if self._queue is not None and self._queue.get_num_unfinalized_calls():
            try:
                self._queue.maybe_finalize_async_calls(blocking=blocking)
            except CheckpointSaveFailed:
                raise
            except (Exception, _CheckpointBaseException) as e:
                step = self._in_flight if self._in_flight is not None else -1
                assert self.save_dir is not None
                path = self.save_dir / iter_dir_name(step)
                self._fail(step, path, self._cause(e, path), comm=is_comm_failure(e), exc=e)

    def pending(self) -> bool:
        return self._queue is not None and self._queue.get_num_unfinalized_calls() > 0

    def _cause(self, e: BaseException, path: Path) -> str:
        """describe_cause, and where the writers lost the OS error (megatron keeps only its class), what
        the filesystem says: less room left than one checkpoint takes is a full disk."""
        cause = describe_cause(e)
        if "[E" in cause or self.save_dir is None:
            return cause
        try:
            st = os.statvfs(self.save_dir)
        except OSError:
            return cause
        free = st.f_bavail * st.f_frsize
        done = complete_steps(self.save_dir)
        need = 0
        if done:
            marker = integrity.read_marker(self.save_dir / iter_dir_name(done[-1])) or {}
            need = int(marker.get("bytes") or 0)
        need = max(need, dir_bytes(path) if path.is_dir() else 0)
        if need and free < need:
            return (
                f"{os.strerror(errno.ENOSPC)} [ENOSPC]: {free} bytes free on the checkpoint filesystem "
                f"of {self.save_dir}, a checkpoint takes {need} ({cause})"
            )
        return cause

    def _fail(
        self, step: int, path: Path, cause: str, comm: bool = False, exc: BaseException | None = None
    ) -> None:
        """Every rank: record the failed save, remove its partial directory (rank 0), raise: the storage's
        failure as CheckpointSaveFailed (the run stops), a lost peer's (comm) as the error itself (the
        agent restarts the ranks, or the job is requeued, from the last good checkpoint)."""
        self._in_flight = None
        self._pending.pop(step, None)
        keep = self.save_dir is None or read_latest(self.save_dir) == step
        if self.rank == 0 and path.is_dir() and not keep:
            shutil.rmtree(path, ignore_errors=True)
        self.telemetry.emit(
            EVENT_CKPT_FAILED, step=step, path=str(path), reason=cause, peer_lost=comm, durable=True
        )
        if comm:
            raise RuntimeError(f"checkpoint {path.name}: a peer was lost during the save: {cause}") from exc
        raise CheckpointSaveFailed(step, path, cause)

    def _complete(self, step: int, path: Path, t0: float) -> None:
        self.fault.maybe_crash(step, self.rank)
        assert self.save_dir is not None
        # every rank reached completion (a rank that died after its shards leaves the save incomplete)
        self._all_ok(True)
        # every rank's writer recorded its shards' digests; rank 0 checks the set and writes the marker
        problem = ""
        nbytes = 0
        hash_s: dict[str, float] = {}
        if self.rank == 0:
            try:
                manifest = integrity.build_manifest(
                    path, self.world, step, self.algorithm, extra={"ts": time.time()}
                )
                integrity.fsync_write_json(path / COMPLETE_MARKER, manifest)
                nbytes = int(manifest["bytes"])
                hash_s = manifest["hash_s"]
                write_latest_atomically(self.save_dir, step)
            except IntegrityError as e:
                problem = f"{e.file}: {e.reason}"
            except OSError as e:
                problem = describe_cause(e)
        problem = self._from_rank0(problem)
        if problem:
            if self.rank == 0:
                (path / COMPLETE_MARKER).unlink(missing_ok=True)
            self._fail(step, path, problem)
        if self.rank == 0:
            self._prune(self.save_dir, step)
        dist.barrier()
        self._in_flight = None
        self._candidates[step] = 0
        if self.memory:
            ckpt_memory.commit(step, path / COMPLETE_MARKER)
        blocking, was_async = self._pending.pop(step, (time.time() - t0, False))
        total = time.time() - t0
        if not was_async:
            blocking = total  # a synchronous save blocks the step loop for all of it
        self.telemetry.emit(
            EVENT_CKPT_END,
            step=step,
            blocking_s=round(blocking, 6),
            total_s=round(total, 6),
            bytes=nbytes if self.rank == 0 else dir_bytes(path),
            path=str(path),
            asynchronous=was_async,
            algorithm=self.algorithm,
            hash_s=hash_s,
            **({"memory_copy_s": round(self._memory_s, 6)} if self.memory else {}),
            durable=True,
        )

    def _prune(self, ckpt_dir: Path, latest: int) -> None:
        in_flight = {self._in_flight} if self._in_flight is not None and self._in_flight != latest else set()
        for s in catalog.retention_plan(ckpt_dir, self.keep_last, latest, in_flight):
            shutil.rmtree(ckpt_dir / iter_dir_name(s), ignore_errors=True)

    # ---- known-good ----------------------------------------------------------------------------
    def note_step(self, step: int, healthy: bool, loss: float) -> None:
        """After every step (all ranks, same `healthy`): a checkpoint followed by `good_after_steps`
        healthy steps becomes known-good; a non-finite step leaves the pending ones unproven."""
        if not healthy:
            self._candidates.clear()
            return
        done = []
        for s in self._candidates:
            if step > s:
                self._candidates[s] += 1
                if self._candidates[s] >= self.good_after_steps:
                    done.append(s)
        for s in done:
            n = self._candidates.pop(s)
            d = self.save_dir or self.load_dir
            if d is None or not (d / iter_dir_name(s) / COMPLETE_MARKER).is_file():
                continue
            if self.rank == 0:
                try:
                    catalog.mark_known_good(d, s, n, step, loss)
                except OSError as e:
                    print(f"lcm-train: could not mark {iter_dir_name(s)} known-good: {e}", flush=True)
                    continue
                self.telemetry.emit(EVENT_CKPT_GOOD, step=s, healthy_steps=n, through_step=step, durable=True)
