"""Fused attention without Transformer Engine: megatron-core's core-attention module, computed by PyTorch's
`scaled_dot_product_attention` (SDPA).

`SDPAttention` (`sdpa_attention_class()`) subclasses megatron-core's `DotProductAttention` (same
constructor, same sharded state: the checkpoint format does not change) and replaces only its forward,
the unfused `baddbmm -> mask -> softmax -> bmm` over a materialised `[b, heads, s, s]` score tensor, with
one SDPA call:

- CUDA: the fused backends only (flash, cuDNN, memory-efficient), chosen by PyTorch per shape and dtype.
  The math backend is excluded, so `--use-flash-attn` never silently runs the unfused computation: a shape
  no fused kernel takes fails with PyTorch's own reasons.
- CPU: the math backend, the reference computation, so CPU runs match the unfused path (bitwise where the
  scale is a power of 4, i.e. head dim 16 or 256; within float rounding otherwise, see docs/training.md).

Causal masking is `is_causal=True` (the engine's mask is the causal one; any other mask type is refused),
no dropout (the engine trains dropout-free), grouped-query attention through `enable_gqa`."""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

FUSED_BACKENDS = (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION)
CPU_BACKENDS = (SDPBackend.MATH,)


def backends_for(device_type: str) -> tuple[SDPBackend, ...]:
    """The SDPA backends the module allows on this device type."""
    return FUSED_BACKENDS if device_type == "cuda" else CPU_BACKENDS


def sdpa_core(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention of megatron's layout: q/k/v `[s, b, heads, head_dim]` -> context `[s, b, heads *
    head_dim]`. Key/value may have fewer heads (query groups): they are shared by `enable_gqa`."""
    q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, heads, s, head_dim]
    gqa = k.size(1) != q.size(1)
    with sdpa_kernel(list(backends_for(q.device.type))):
        ctx = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True, scale=scale, enable_gqa=gqa
        )
    s, b = query.size(0), query.size(1)
    return ctx.permute(2, 0, 1, 3).reshape(s, b, -1)


_CLASS: type | None = None


def sdpa_attention_class() -> type:
    """The layer spec's `core_attention`: megatron-core's DotProductAttention subclass (built once, on first
    use, so importing this module does not import megatron)."""
    global _CLASS
    if _CLASS is None:
        from megatron.core.transformer.dot_product_attention import DotProductAttention

        _CLASS = _make_class(DotProductAttention)
    return _CLASS


def _make_class(base: type) -> type:
    from megatron.core.transformer.enums import AttnMaskType

    class SDPAttentionModule(base):  # type: ignore[misc,valid-type]
        """megatron-core DotProductAttention whose forward is one fused SDPA call (module docstring)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            cfg = self.config
            if self.attn_mask_type != AttnMaskType.causal:
                raise ValueError(f"SDPAttention: only causal attention (got {self.attn_mask_type})")
            if cfg.attention_dropout:
                raise ValueError("SDPAttention: the engine trains dropout-free (attention_dropout must be 0)")
            if cfg.softmax_type != "vanilla" or self.scale_mask_softmax.window_size is not None:
                raise ValueError("SDPAttention: only the vanilla softmax without a sliding window")

        def forward(
            self,
            query: torch.Tensor,
            key: torch.Tensor,
            value: torch.Tensor,
            attention_mask: torch.Tensor | None,
            attn_mask_type: Any = None,
            attention_bias: torch.Tensor | None = None,
            packed_seq_params: Any = None,
        ) -> torch.Tensor:
            if packed_seq_params is not None or attention_bias is not None:
                raise ValueError("SDPAttention: packed sequences and attention bias are not supported")
            if attn_mask_type is not None and attn_mask_type != AttnMaskType.causal:
                raise ValueError(f"SDPAttention: only causal attention (got {attn_mask_type})")
            return sdpa_core(query, key, value, self.softmax_scale)

    SDPAttentionModule.__name__ = SDPAttentionModule.__qualname__ = "SDPAttention"
    return SDPAttentionModule
