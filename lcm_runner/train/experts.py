"""Grouped expert GEMMs without Transformer Engine or the `grouped_gemm` package: megatron-core's
`SequentialMLP`, computed by PyTorch's `torch._grouped_mm` (`--moe-grouped-gemm`).

`SequentialMLP` runs the local experts one after the other: per expert a host read of its token count
(`tokens_per_expert.tolist()`, a device synchronisation), a split, two matmuls, an activation, a scale by
the router's probabilities. At the H200 shape of issue 14 (8 experts, 4 layers) that is ~200 small kernel
launches a step and the host's launch path, not the GPU, sets the step time (docs/results/
h200-engine-vs-megatron/). `GroupedExperts` keeps SequentialMLP's modules, parameters and sharded state
dict (the checkpoint format does not change: a checkpoint of either loads into the other) and replaces
only the forward with one grouped GEMM per projection over all local experts:

    h = grouped_mm(x, stack(W1_e)^T, offs)    # every expert's fc1 at once; offs = cumsum(tokens)
    h = act(h) * probs                       # as megatron's MLP: the activation, then the scale
    y = grouped_mm(h, stack(W2_e)^T, offs)

The offsets stay on the device (no synchronisation). The stacked weights are a copy per forward (for 8
experts of 1024 x 4096 in bf16, 64 MiB per projection and layer, kept for the backward); their gradients
flow back to each expert's own parameter, so DDP, the optimizer and the checkpoint see SequentialMLP's
parameters.

Where `torch._grouped_mm` does not apply, the module runs SequentialMLP's forward unchanged, and says
so once (`why_sequential`): one local expert, biases (the engine trains without), fp8/fp4, an activation
other than megatron's plain (non-fused) path; on CUDA a dtype other than bf16 or a GPU before sm90. On
CPU `torch._grouped_mm` loops over the groups with the same matmul as `F.linear`: forward and gradients
are bitwise SequentialMLP's (tests/unit/test_train_experts.py).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

_CLASS: type | None = None


def why_sequential(config: Any, num_local_experts: int, device: torch.device, dtype: torch.dtype) -> str:
    """Why the grouped path cannot run (\"\" when it can)."""
    if not hasattr(torch, "_grouped_mm"):
        return f"torch {torch.__version__} has no torch._grouped_mm"
    if num_local_experts < 2:
        return "one local expert: nothing to group"
    if config.add_bias_linear:
        return "expert biases (add_bias_linear)"
    if getattr(config, "fp8", None) or getattr(config, "fp4", None):
        return "fp8/fp4 experts"
    if config.use_te_activation_func or config.bias_activation_fusion or config.moe_apply_probs_on_input:
        return "a fused or TE activation, or probabilities applied on the input"
    if device.type == "cuda":
        if dtype != torch.bfloat16:
            return f"{dtype} on CUDA (torch._grouped_mm takes bf16)"
        if torch.cuda.get_device_capability(device) < (9, 0):
            return "a GPU before sm90"
    return ""


def _activate(config: Any, h: torch.Tensor) -> torch.Tensor:
    """megatron's MLP activation on its non-fused path (mlp.py: `glu` or `activation_func`)."""
    if not config.gated_linear_unit:
        return config.activation_func(h)
    x_glu, x_linear = torch.chunk(h, 2, dim=-1)
    if (val := config.activation_func_clamp_value) is not None:
        x_glu = x_glu.clamp(min=None, max=val)
        x_linear = x_linear.clamp(min=-val, max=val)
    return config.activation_func(x_glu) * (x_linear + config.glu_linear_offset)


def grouped_forward(
    config: Any, experts: Any, x: torch.Tensor, tokens_per_expert: torch.Tensor, probs: torch.Tensor
) -> torch.Tensor:
    """The local experts' MLPs over their contiguous token groups, two grouped GEMMs in all."""
    offs = torch.cumsum(tokens_per_expert.to(device=x.device, dtype=torch.int32), 0, dtype=torch.int32)
    w1 = torch.stack([e.linear_fc1.weight for e in experts]).transpose(1, 2)  # [E, h, ffn]
    h = torch._grouped_mm(x, w1, offs=offs)
    h = _activate(config, h)
    h = (h * probs.unsqueeze(-1)).to(x.dtype)
    w2 = torch.stack([e.linear_fc2.weight for e in experts]).transpose(1, 2)  # [E, ffn, h]
    return torch._grouped_mm(h, w2, offs=offs)


def grouped_experts_class() -> type:
    """The MoE layer spec's `experts` module: SequentialMLP's subclass (built on first use)."""
    global _CLASS
    if _CLASS is None:
        from megatron.core.transformer.moe.experts import SequentialMLP

        class GroupedExperts(SequentialMLP):
            """SequentialMLP whose forward is two grouped GEMMs (lcm_runner/train/experts.py)."""

            sequential_reason: str | None = None  # set at the first forward

            def forward(
                self, permuted_local_hidden_states: torch.Tensor, tokens_per_expert: torch.Tensor,
                permuted_probs: torch.Tensor,
            ) -> tuple[torch.Tensor, None]:  # fmt: skip
                x = permuted_local_hidden_states
                if self.sequential_reason is None:
                    self.sequential_reason = why_sequential(
                        self.config, self.num_local_experts, x.device, x.dtype
                    )
                if self.sequential_reason:
                    return super().forward(x, tokens_per_expert, permuted_probs)
                out = grouped_forward(self.config, self.local_experts, x, tokens_per_expert, permuted_probs)
                return out, None

        _CLASS = GroupedExperts
    return _CLASS


def use_grouped_experts(spec: Any) -> None:
    """Swap the MoE layer spec's SequentialMLP for GroupedExperts, in place (same submodules)."""
    mlp = spec.submodules.mlp
    subs = mlp.keywords["submodules"] if isinstance(mlp, functools.partial) else mlp.submodules
    experts = subs.experts
    inner = experts.keywords["submodules"] if isinstance(experts, functools.partial) else experts.submodules
    subs.experts = functools.partial(grouped_experts_class(), submodules=inner)
