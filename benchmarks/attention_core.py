"""The attention core alone: megatron-core's unfused DotProductAttention against the engine's SDPAttention
(lcm_runner/train/attention.py), forward + backward of one layer, and how far their outputs and gradients
are apart. One process, one device (CUDA when present, else CPU with a small shape).

    python3 benchmarks/attention_core.py [--out F.json] [--batch 2 --heads 16 --seq 4096 --head-dim 64]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import time

import torch


def _init() -> str:
    import torch.distributed as dist

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev == "cpu":
        from lcm_runner.train import cpu_compat

        cpu_compat.stub_triton_kernels()
    from megatron.core import parallel_state as ps

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
    if dev == "cpu":
        cpu_compat.apply()
    dist.init_process_group("nccl" if dev == "cuda" else "gloo")
    ps.initialize_model_parallel()
    from megatron.core import tensor_parallel

    tensor_parallel.model_parallel_cuda_manual_seed(0, inference_rng_tracker=dev == "cpu")
    return dev


def _modules(heads: int, head_dim: int, dtype: torch.dtype) -> tuple[torch.nn.Module, torch.nn.Module]:
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    from lcm_runner.train.attention import sdpa_attention_class

    cfg = TransformerConfig(
        num_layers=1, hidden_size=heads * head_dim, num_attention_heads=heads, attention_dropout=0.0,
        hidden_dropout=0.0, bf16=dtype == torch.bfloat16, params_dtype=dtype, masked_softmax_fusion=False,
    )  # fmt: skip
    unfused = DotProductAttention(cfg, 1, AttnMaskType.causal, "self")
    fused = sdpa_attention_class()(cfg, 1, AttnMaskType.causal, "self")
    return unfused, fused


def _time(fn, reps: int, sync) -> list[float]:
    out = []
    for _ in range(reps):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - t)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--seq", type=int)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--reps", type=int, default=20)
    a = p.parse_args()
    dev = _init()
    seq = a.seq or (4096 if dev == "cuda" else 256)
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    unfused, fused = _modules(a.heads, a.head_dim, dtype)
    unfused, fused = unfused.to(dev), fused.to(dev)
    g = torch.Generator(device="cpu").manual_seed(0)
    shape = (seq, a.batch, a.heads, a.head_dim)
    qkv = [torch.randn(shape, generator=g).to(dev, dtype) for _ in range(3)]
    grad_out = torch.randn((seq, a.batch, a.heads * a.head_dim), generator=g).to(dev, dtype)
    mask = torch.triu(torch.ones(1, 1, seq, seq, dtype=torch.bool), diagonal=1).to(dev)
    results = {}
    outs = {}
    for name, mod in (("unfused", unfused), ("sdpa", fused)):
        leaves = [t.clone().requires_grad_(True) for t in qkv]

        def fwd_bwd(mod=mod, leaves=leaves) -> torch.Tensor:
            for t in leaves:
                t.grad = None
            out = mod(*leaves, mask)
            out.backward(grad_out)
            return out

        out = fwd_bwd()
        outs[name] = (out.detach().float(), [t.grad.detach().float() for t in leaves])
        for _ in range(3):
            fwd_bwd()
        times = _time(fwd_bwd, a.reps, sync)
        results[name] = {"median_ms": round(statistics.median(times) * 1000, 3), "reps": a.reps}
    (o1, g1), (o2, g2) = outs["unfused"], outs["sdpa"]
    diff = {
        "out_max_abs": float((o1 - o2).abs().max()),
        "out_max_rel": float((o1 - o2).abs().max() / o1.abs().max()),
        "grad_max_abs": max(float((x - y).abs().max()) for x, y in zip(g1, g2, strict=True)),
    }
    report = {
        "device": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu",
        "dtype": str(dtype).removeprefix("torch."),
        "shape": {"batch": a.batch, "heads": a.heads, "seq": seq, "head_dim": a.head_dim},
        "fwd_bwd": results,
        "speedup": round(results["unfused"]["median_ms"] / results["sdpa"]["median_ms"], 2),
        "difference": diff,
    }
    print(json.dumps(report, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
