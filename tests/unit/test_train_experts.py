"""The grouped expert GEMMs (lcm_runner/train/experts.py) against megatron's per-expert computation, on
CPU in fp32: forward and gradients bitwise, with empty experts and a gated (SwiGLU) activation; and the
cases where the grouped path must not run, each with its reason."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from lcm_runner.train.experts import grouped_forward, why_sequential


def _config(**over: object) -> SimpleNamespace:
    c = dict(
        gated_linear_unit=False, activation_func=F.gelu, activation_func_clamp_value=None,
        glu_linear_offset=0.0, add_bias_linear=False, fp8=None, fp4=None, use_te_activation_func=False,
        bias_activation_fusion=False, moe_apply_probs_on_input=False,
    )  # fmt: skip
    c.update(over)
    return SimpleNamespace(**c)


def _experts(n: int, hidden: int, ffn: int, gated: bool) -> list[SimpleNamespace]:
    g = torch.Generator().manual_seed(7)
    out = []
    for _ in range(n):
        w1 = torch.randn(ffn * (2 if gated else 1), hidden, generator=g, requires_grad=True)
        w2 = torch.randn(hidden, ffn, generator=g, requires_grad=True)
        out.append(
            SimpleNamespace(linear_fc1=SimpleNamespace(weight=w1), linear_fc2=SimpleNamespace(weight=w2))
        )
    return out


def _sequential(
    config: SimpleNamespace, experts: list, x: torch.Tensor, counts: list[int], probs: torch.Tensor
):
    """megatron's SequentialMLP + MLP forward on its non-fused path, written out."""
    outs = []
    for e, xs, ps in zip(experts, torch.split(x, counts), torch.split(probs, counts), strict=True):
        h = F.linear(xs, e.linear_fc1.weight)
        if config.gated_linear_unit:
            a, b = torch.chunk(h, 2, dim=-1)
            h = config.activation_func(a) * (b + config.glu_linear_offset)
        else:
            h = config.activation_func(h)
        h = (h * ps.unsqueeze(-1)).to(xs.dtype)
        outs.append(F.linear(h, e.linear_fc2.weight))
    return torch.cat(outs)


@pytest.mark.parametrize(
    ("counts", "gated"),
    [([5, 3, 0, 8], False), ([0, 0, 16, 0], False), ([4, 4, 4, 4], True), ([1, 0, 7, 2], True)],
)
def test_grouped_forward_and_gradients_are_bitwise_the_per_expert_ones(
    counts: list[int], gated: bool
) -> None:
    cfg = _config(gated_linear_unit=gated, activation_func=F.silu if gated else F.gelu)
    hidden, ffn, n = 32, 48, sum(counts)
    g = torch.Generator().manual_seed(3)
    x0 = torch.randn(n, hidden, generator=g)
    p0 = torch.rand(n, generator=g)
    grad = torch.randn(n, hidden, generator=g)
    results = []
    for fn in ("grouped", "sequential"):
        experts = _experts(len(counts), hidden, ffn, gated)
        x, probs = x0.clone().requires_grad_(), p0.clone().requires_grad_()
        if fn == "grouped":
            y = grouped_forward(cfg, experts, x, torch.tensor(counts), probs)
        else:
            y = _sequential(cfg, experts, x, counts, probs)
        y.backward(grad)
        results.append(
            [y.detach(), x.grad, probs.grad]
            + [t for e in experts for t in (e.linear_fc1.weight.grad, e.linear_fc2.weight.grad)]
        )
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)


def test_the_grouped_path_says_why_it_does_not_run() -> None:
    cpu, f32 = torch.device("cpu"), torch.float32
    assert why_sequential(_config(), 4, cpu, f32) == ""
    assert "one local expert" in why_sequential(_config(), 1, cpu, f32)
    assert "bias" in why_sequential(_config(add_bias_linear=True), 4, cpu, f32)
    assert "fp8" in why_sequential(_config(fp8="hybrid"), 4, cpu, f32)
    assert "fused" in why_sequential(_config(bias_activation_fusion=True), 4, cpu, f32)
    if torch.cuda.is_available():  # pragma: no cover - GPU machines only
        assert "bf16" in why_sequential(_config(), 4, torch.device("cuda"), f32)
