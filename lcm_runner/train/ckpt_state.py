"""The state a checkpoint holds, as dist_checkpointing sharded state: model, optimizer, iteration, RNG.

A mixin of CheckpointManager (checkpoint.py), which provides `rank`, `world` and `device`.
"""

from __future__ import annotations

from typing import Any

import torch

TORCH_OPTIMIZER_KEY = "optimizer_torch"
LEGACY_OPTIMIZER_KEY = "optimizer_torch"  # the pickled object of older checkpoints (optimizer_torch/shard_*)
TORCH_MOMENTS = ("exp_avg", "exp_avg_sq")


class CheckpointState:
    rank: int
    world: int
    device: str

    def _sharded_state(
        self, built: Any, step: int, is_loading: bool, meta: dict[str, Any], legacy_optimizer: bool = False
    ) -> dict[str, Any]:
        """`legacy_optimizer`: the torch optimizer as one pickled object per rank (checkpoints written
        before 2026-12-03), for loading those."""
        from megatron.core.dist_checkpointing.mapping import ShardedObject

        model_sd = built.gpt.sharded_state_dict(prefix="")
        state: dict[str, Any] = {"model": model_sd, "iteration": step, "checkpoint_version": 3.0, "lcm": meta}
        per_rank = dict(global_shape=(self.world,), global_offset=(self.rank,), replica_id=0)
        if built.optimizer_impl == "megatron":
            state["optimizer"] = built.optimizer.sharded_state_dict(model_sd, is_loading=is_loading)
        elif legacy_optimizer:
            data = None if is_loading else built.optimizer.state_dict()
            state["optimizer"] = ShardedObject(LEGACY_OPTIMIZER_KEY, data, **per_rank)
        else:
            state["optimizer"] = self._torch_optimizer_state(built.optimizer, is_loading, per_rank)
        state["rng_state"] = ShardedObject("rng_state", None if is_loading else self._rng_state(), **per_rank)
        return state

    def _torch_optimizer_state(
        self, optimizer: Any, is_loading: bool, per_rank: dict[str, Any]
    ) -> dict[str, Any]:
        """The torch AdamW state as sharded tensors: each moment of each parameter is a tensor of this rank
        (key optimizer_torch.rank<R>.<index>.<moment>), written by the writer like the model's shards; the
        steps and hyper-parameters are one small object. (As one pickled object the whole state was
        serialised in the step loop: on CPU 0.9 s of every save's 0.96 s blocking, asynchronous or not.)"""
        from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensor

        params = [p for group in optimizer.param_groups for p in group["params"]]
        sd = None if is_loading else optimizer.state_dict()
        saved = {} if sd is None else sd["state"]
        tensors = {}
        for i, param in enumerate(params):
            for name in TORCH_MOMENTS:
                if is_loading:
                    t = torch.empty_like(param)
                elif i in saved:
                    t = saved[i][name]
                else:  # no state yet (no gradient so far): zeros, and `present` says so
                    t = torch.zeros_like(param)
                key = f"{TORCH_OPTIMIZER_KEY}.rank{self.rank}.{i}.{name}"
                tensors[f"{i}.{name}"] = ShardedTensor.from_rank_offsets(key, t, replica_id=0)
        head = None
        if sd is not None:
            head = {
                "param_groups": sd["param_groups"],
                "present": sorted(saved),
                "scalars": {
                    i: {k: v for k, v in st.items() if k not in TORCH_MOMENTS} for i, st in saved.items()
                },
            }
        return {"head": ShardedObject(f"{TORCH_OPTIMIZER_KEY}_head", head, **per_rank), "tensors": tensors}

    @staticmethod
    def torch_optimizer_state_dict(loaded: dict[str, Any]) -> dict[str, Any]:
        """The loaded sharded form back as torch's optimizer state dict."""
        head, tensors = loaded["head"], loaded["tensors"]
        state = {}
        for i in head["present"]:
            state[i] = {**head["scalars"][i], **{m: tensors[f"{i}.{m}"] for m in TORCH_MOMENTS}}
        return {"state": state, "param_groups": head["param_groups"]}

    def _memory_state(self, built: Any, meta: dict[str, Any]) -> dict[str, Any]:
        """The same state as a plain (unsharded) tree, for the host-memory copy (ckpt_memory)."""
        return {
            "model": built.gpt.state_dict(),
            "optimizer": built.optimizer.state_dict(),
            "rng_state": self._rng_state(),
            "lcm": meta,
        }

    def _rng_state(self) -> dict[str, Any]:
        rng: dict[str, Any] = {"torch_cpu": torch.get_rng_state()}
        if self.device == "cuda":
            from megatron.core.tensor_parallel import get_cuda_rng_tracker

            rng["cuda"] = torch.cuda.get_rng_state()
            rng["tracker"] = get_cuda_rng_tracker().get_states()
        return rng

    def _set_rng_state(self, rng: dict[str, Any]) -> None:
        """Every state is handed over as a copy of its own: torch's CPU generator reads a state tensor at
        storage base + storage_offset counted in units of its 5056-byte state struct, not in bytes, so a
        view into a larger buffer (the host copy's tensors are views into one shared-memory mapping,
        ckpt_shm.Region.map_views) gave it another state or, for a view far into a 3 GB mapping, an
        address outside it: the warm restart's SIGSEGV on the H100 (2026-12-07)."""
        rng = _own(rng)
        torch.set_rng_state(rng["torch_cpu"])
        if self.device == "cuda" and "cuda" in rng:
            from megatron.core.tensor_parallel import get_cuda_rng_tracker

            torch.cuda.set_rng_state(rng["cuda"])
            get_cuda_rng_tracker().set_states(rng["tracker"])


def _own(tree: Any) -> Any:
    """`tree` with every tensor cloned (contiguous, at offset 0 of a storage of its own)."""
    if isinstance(tree, torch.Tensor):
        return tree.clone()
    if isinstance(tree, dict):
        return {k: _own(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_own(v) for v in tree)
    return tree
