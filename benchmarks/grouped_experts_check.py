"""The grouped expert GEMMs (lcm_runner/train/experts.py) against the per-expert loop of megatron's
SequentialMLP on one GPU, bf16: accuracy (both against an fp32 reference of the same loop) on token
counts that are not multiples of anything, with empty experts, and the time of one MoE layer's experts
(fwd + bwd) at the issue-14 shape.

    python3 benchmarks/grouped_experts_check.py --out grouped_experts.json

Exit 1 when the grouped result is further from the fp32 reference than 2x the loop's own bf16 error
(plus a floor of one bf16 ulp at the output's scale).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lcm_runner.train.experts import grouped_forward


def _cfg() -> SimpleNamespace:
    return SimpleNamespace(
        gated_linear_unit=False,
        activation_func=F.gelu,
        activation_func_clamp_value=None,
        glu_linear_offset=0.0,
    )


def _experts(n: int, hidden: int, ffn: int, dtype: torch.dtype, dev: str) -> list[SimpleNamespace]:
    g = torch.Generator().manual_seed(11)
    out = []
    for _ in range(n):
        w1 = (torch.randn(ffn, hidden, generator=g) * hidden**-0.5).to(dev, dtype).requires_grad_()
        w2 = (torch.randn(hidden, ffn, generator=g) * ffn**-0.5).to(dev, dtype).requires_grad_()
        out.append(
            SimpleNamespace(linear_fc1=SimpleNamespace(weight=w1), linear_fc2=SimpleNamespace(weight=w2))
        )
    return out


def _loop(experts: list, x: torch.Tensor, counts: list[int], probs: torch.Tensor) -> torch.Tensor:
    outs = []
    for e, xs, ps in zip(experts, torch.split(x, counts), torch.split(probs, counts), strict=True):
        h = (F.gelu(F.linear(xs, e.linear_fc1.weight)) * ps.unsqueeze(-1)).to(xs.dtype)
        outs.append(F.linear(h, e.linear_fc2.weight))
    return torch.cat(outs)


def _run(fn: str, counts: list[int], hidden: int, ffn: int, dtype: torch.dtype, x0, p0, g0, experts=None):
    if experts is None:
        experts = _experts(len(counts), hidden, ffn, dtype, "cuda")
    x = x0.to(dtype).clone().requires_grad_()
    probs = p0.clone().requires_grad_()
    if fn == "grouped":
        y = grouped_forward(_cfg(), experts, x, torch.tensor(counts, device="cuda"), probs)
    else:
        y = _loop(experts, x, counts, probs)
    y.backward(g0.to(dtype))
    return [y.float(), x.grad.float()] + [
        t.float() for e in experts for t in (e.linear_fc1.weight.grad, e.linear_fc2.weight.grad)
    ]


def accuracy(counts: list[int], hidden: int, ffn: int) -> dict:
    g = torch.Generator().manual_seed(5)
    n = sum(counts)
    x0 = torch.randn(n, hidden, generator=g).cuda()
    p0 = torch.rand(n, generator=g).cuda()
    g0 = torch.randn(n, hidden, generator=g).cuda()
    ref = _run("loop", counts, hidden, ffn, torch.float32, x0, p0, g0)
    res = {}
    for fn in ("grouped", "loop"):
        got = _run(fn, counts, hidden, ffn, torch.bfloat16, x0, p0, g0)
        res[fn] = max(
            ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()
            for a, b in zip(got, ref, strict=True)
        )
    return {"counts": counts, "max_rel_err_vs_fp32": res}


def timing(counts: list[int], hidden: int, ffn: int, reps: int) -> dict:
    n = sum(counts)
    x0 = torch.randn(n, hidden, device="cuda")
    p0 = torch.rand(n, device="cuda")
    g0 = torch.randn(n, hidden, device="cuda")
    out = {}
    experts = _experts(len(counts), hidden, ffn, torch.bfloat16, "cuda")  # built once, outside the timing
    for fn in ("loop", "grouped"):
        for _ in range(3):
            _run(fn, counts, hidden, ffn, torch.bfloat16, x0, p0, g0, experts)
        t = []
        for _ in range(reps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            _run(fn, counts, hidden, ffn, torch.bfloat16, x0, p0, g0, experts)
            torch.cuda.synchronize()
            t.append((time.perf_counter() - t0) * 1000)
        out[fn] = {"median_ms": round(statistics.median(t), 3)}
    out["speedup"] = round(out["loop"]["median_ms"] / out["grouped"]["median_ms"], 2)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    hidden, ffn = 1024, 4096
    cases = [
        [0, 1, 7, 13, 1000, 3, 0, 17],
        [2048] * 8,
        [16384, 0, 0, 0, 0, 0, 0, 0],
        [5, 2043, 3001, 1, 9, 4000, 3, 7324],
    ]
    acc = [accuracy(c, hidden, ffn) for c in cases]
    # the shape of issue 14: 2 x 4096 tokens, top-2 of 8 experts: 16384 routed rows, about 2048 an expert
    tim = timing([1900, 2200, 2050, 1980, 2100, 2010, 2070, 2074], hidden, ffn, a.reps)
    ok = all(r["max_rel_err_vs_fp32"]["grouped"] <= 2 * r["max_rel_err_vs_fp32"]["loop"] + 2**-8 for r in acc)
    doc = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "accuracy": acc,
           "experts_fwd_bwd_one_layer": tim, "ok": ok}  # fmt: skip
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
