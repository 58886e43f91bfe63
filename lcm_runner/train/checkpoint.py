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
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from lcm_runner.contracts import (
    EVENT_CKPT_BEGIN,
    EVENT_CKPT_END,
    EVENT_RESUME,
    LATEST_FILE,
    ExitCode,
    iter_dir_name,
)

from .telemetry import TelemetryWriter

COMPLETE_MARKER = "lcm_complete.json"


class CheckpointError(RuntimeError):
    pass


def read_latest(ckpt_dir: str | Path) -> int | None:
    """The step named by <dir>/latest_checkpointed_iteration.txt, or None when there is none."""
    p = Path(ckpt_dir) / LATEST_FILE
    if not p.is_file():
        return None
    text = p.read_text().strip()
    if not text.isdigit():
        raise CheckpointError(f"{p}: expected a step number, found {text!r}")
    return int(text)


def write_latest_atomically(ckpt_dir: Path, step: int) -> None:
    tmp = ckpt_dir / f".{LATEST_FILE}.tmp"
    with open(tmp, "w") as f:
        f.write(f"{step}\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, ckpt_dir / LATEST_FILE)
    dfd = os.open(ckpt_dir, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def complete_steps(ckpt_dir: Path) -> list[int]:
    """Steps with a complete (marker-bearing) iter_ directory, ascending."""
    out = []
    for d in ckpt_dir.glob("iter_*"):
        if d.is_dir() and (d / COMPLETE_MARKER).is_file() and d.name[5:].isdigit():
            out.append(int(d.name[5:]))
    return sorted(out)


@dataclass
class Fault:
    """--fault-crash-in-save: hard-exit `rank` once its shards of `step` are written, before completion."""

    crash_step: int = 0
    crash_rank: int = 0

    def maybe_crash(self, step: int, rank: int) -> None:
        if self.crash_step and step == self.crash_step and rank == self.crash_rank:
            print(f"[rank{rank}] fault injection: crash during the save of step {step}", flush=True)
            os._exit(int(ExitCode.FAILURE))


@dataclass
class CheckpointManager:
    save_dir: Path | None
    load_dir: Path | None
    keep_last: int
    async_save: bool
    telemetry: TelemetryWriter
    device: str
    fault: Fault = field(default_factory=Fault)
    _queue: Any = None
    _pending: dict[int, tuple[float, bool]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        if self.save_dir is not None:
            from .procutil import install_checkpoint_results_queue

            install_checkpoint_results_queue()
        if self.async_save:
            from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue

            self._queue = AsyncCallsQueue(persistent=False)

    # ---- state dict ----------------------------------------------------------------------------
    def _sharded_state(self, built: Any, step: int, is_loading: bool, meta: dict[str, Any]) -> dict[str, Any]:
        from megatron.core.dist_checkpointing.mapping import ShardedObject

        model_sd = built.gpt.sharded_state_dict(prefix="")
        state: dict[str, Any] = {"model": model_sd, "iteration": step, "checkpoint_version": 3.0, "lcm": meta}
        per_rank = dict(global_shape=(self.world,), global_offset=(self.rank,), replica_id=0)
        if built.optimizer_impl == "megatron":
            state["optimizer"] = built.optimizer.sharded_state_dict(model_sd, is_loading=is_loading)
        else:
            data = None if is_loading else built.optimizer.state_dict()
            state["optimizer"] = ShardedObject("optimizer_torch", data, **per_rank)
        state["rng_state"] = ShardedObject("rng_state", None if is_loading else self._rng_state(), **per_rank)
        return state

    def _rng_state(self) -> dict[str, Any]:
        rng: dict[str, Any] = {"torch_cpu": torch.get_rng_state()}
        if self.device == "cuda":
            from megatron.core.tensor_parallel import get_cuda_rng_tracker

            rng["cuda"] = torch.cuda.get_rng_state()
            rng["tracker"] = get_cuda_rng_tracker().get_states()
        return rng

    def _set_rng_state(self, rng: dict[str, Any]) -> None:
        torch.set_rng_state(rng["torch_cpu"])
        if self.device == "cuda" and "cuda" in rng:
            from megatron.core.tensor_parallel import get_cuda_rng_tracker

            torch.cuda.set_rng_state(rng["cuda"])
            get_cuda_rng_tracker().set_states(rng["tracker"])

    # ---- save ----------------------------------------------------------------------------------
    def save(self, built: Any, step: int, meta: dict[str, Any], force_sync: bool = False) -> None:
        """Save step `step`. Returns once the blocking part is done (async) or everything is (sync)."""
        from megatron.core import dist_checkpointing

        assert self.save_dir is not None
        self.finalize(blocking=True)  # at most one save in flight
        path = self.save_dir / iter_dir_name(step)
        t0 = time.time()
        self.telemetry.emit(EVENT_CKPT_BEGIN, step=step, path=str(path), durable=True)
        if self.rank == 0:
            if path.exists():  # a leftover of a crashed save of the same step: start clean
                shutil.rmtree(path)
            path.mkdir(parents=True)
        dist.barrier()
        state = self._sharded_state(built, step, is_loading=False, meta=meta)
        use_async = self.async_save and not force_sync
        req = dist_checkpointing.save(state, str(path), async_sharded_save=use_async, async_strategy="mcore")
        if use_async:
            req.finalize_fns.append(lambda: self._complete(step, path, t0))
            self._queue.schedule_async_request(req)
            self._pending[step] = (time.time() - t0, True)
        else:
            self._pending[step] = (time.time() - t0, False)
            self._complete(step, path, t0)

    def finalize(self, blocking: bool = False) -> None:
        """Complete finished async saves (all ranks must call it at the same points)."""
        if self._queue is not None and self._queue.get_num_unfinalized_calls():
            self._queue.maybe_finalize_async_calls(blocking=blocking)

    def pending(self) -> bool:
        return self._queue is not None and self._queue.get_num_unfinalized_calls() > 0

    def _complete(self, step: int, path: Path, t0: float) -> None:
        self.fault.maybe_crash(step, self.rank)
        mine = list(path.glob(f"__{self.rank}_*.distcp"))
        ok = torch.tensor([1 if mine and all(f.stat().st_size > 0 for f in mine) else 0], dtype=torch.int32)
        if self.rank == 0 and not ((path / "metadata.json").is_file() and (path / ".metadata").is_file()):
            ok[0] = 0
        if self.device == "cuda":
            ok = ok.cuda()
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        if int(ok.item()) != 1:
            raise CheckpointError(f"checkpoint {path} failed verification on some rank; latest not moved")
        nbytes = 0
        if self.rank == 0:
            nbytes = dir_bytes(path)
            marker = path / COMPLETE_MARKER
            with open(marker, "w") as f:
                json.dump({"step": step, "bytes": nbytes, "world_size": self.world, "ts": time.time()}, f)
                f.flush()
                os.fsync(f.fileno())
            write_latest_atomically(path.parent, step)
            self._prune(path.parent, step)
        dist.barrier()
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
            durable=True,
        )

    def _prune(self, ckpt_dir: Path, latest: int) -> None:
        if self.keep_last <= 0:
            return
        keep = set(complete_steps(ckpt_dir)[-self.keep_last :]) | {latest}
        for d in ckpt_dir.glob("iter_*"):
            if not d.is_dir() or not d.name[5:].isdigit():
                continue
            step = int(d.name[5:])
            # complete ones beyond N, and incomplete leftovers older than latest (never a save in flight)
            if step not in keep and step < latest:
                shutil.rmtree(d, ignore_errors=True)

    # ---- load ----------------------------------------------------------------------------------
    def load_latest(
        self, built: Any, load_optim: bool = True, load_rng: bool = True
    ) -> tuple[int, dict[str, Any]]:
        """Load <load_dir>/latest into the model (and optimizer, RNG). Returns (step, lcm meta); (0, {})."""
        from megatron.core import dist_checkpointing

        if self.load_dir is None:
            return 0, {}
        step = read_latest(self.load_dir)
        if step is None:
            return 0, {}
        path = self.load_dir / iter_dir_name(step)
        if not (path / "metadata.json").is_file():
            raise CheckpointError(
                f"{self.load_dir / LATEST_FILE} names step {step} but {path} is not a checkpoint"
            )
        t0 = time.time()
        template = self._sharded_state(built, step, is_loading=True, meta={})
        if not load_optim:
            template.pop("optimizer")
        if not load_rng:
            template.pop("rng_state")
        state = dist_checkpointing.load(template, str(path))
        built.gpt.load_state_dict(state["model"])
        if load_optim:
            built.optimizer.load_state_dict(state["optimizer"])
        elif built.optimizer_impl == "megatron":
            built.optimizer.reload_model_params()  # fp32 main params from the loaded bf16 model
        if load_rng:
            self._set_rng_state(state["rng_state"])
        if self.device == "cuda":
            torch.cuda.synchronize()
        dist.barrier()
        load_s = time.time() - t0
        self.telemetry.emit(
            EVENT_RESUME, step=int(state["iteration"]), load_s=round(load_s, 6), path=str(path)
        )
        return int(state["iteration"]), dict(state.get("lcm") or {})
