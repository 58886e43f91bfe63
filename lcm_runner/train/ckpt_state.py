"""The state a checkpoint holds, as dist_checkpointing sharded state: model, optimizer, iteration, RNG.

A mixin of CheckpointManager (checkpoint.py), which provides `rank`, `world` and `device`.
"""

from __future__ import annotations

from typing import Any

import torch


class CheckpointState:
    rank: int
    world: int
    device: str

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
