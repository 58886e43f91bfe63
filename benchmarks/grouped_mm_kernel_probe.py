"""Which kernel torch._grouped_mm runs on this GPU for the engine's expert shape (8 experts, hidden 1024,
FFN 4096, ~2048 rows an expert, bf16), whether its output equals the per-expert F.linear loop bit for bit,
and both times (one forward projection). One H200 result: docs/results/h200-engine-vs-megatron/
grouped_mm_kernel_probe.txt.

    python3 benchmarks/grouped_mm_kernel_probe.py
"""

import time

import torch
from torch.profiler import ProfilerActivity, profile

dev = "cuda"
E, H, F = 8, 1024, 4096
counts = [1900, 2200, 2050, 1980, 2100, 2010, 2070, 2074]
n = sum(counts)
x = torch.randn(n, H, device=dev, dtype=torch.bfloat16)
w = torch.randn(E, F, H, device=dev, dtype=torch.bfloat16)
offs = torch.cumsum(torch.tensor(counts, device=dev, dtype=torch.int32), 0, dtype=torch.int32)


def loop():
    return torch.cat([torch.nn.functional.linear(xs, w[i]) for i, xs in enumerate(torch.split(x, counts))])


for name, B in (("stack-transposed", w.transpose(1, 2)), ("contiguous", w.transpose(1, 2).contiguous())):
    y = torch._grouped_mm(x, B, offs=offs)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(5):
            torch._grouped_mm(x, B, offs=offs)
        torch.cuda.synchronize()
    ks = sorted({e.name[:90] for e in p.events() if e.device_type.name == "CUDA"})
    print(
        name,
        "bitwise==loop:",
        torch.equal(y, loop()),
        "maxdiff",
        (y.float() - loop().float()).abs().max().item(),
    )
    print("  kernels:", ks[:4])
    t = []
    for _ in range(20):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        torch._grouped_mm(x, B, offs=offs)
        torch.cuda.synchronize()
        t.append(time.perf_counter() - t0)
    print("  median ms", sorted(t)[10] * 1000)
t = []
for _ in range(20):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    loop()
    torch.cuda.synchronize()
    t.append(time.perf_counter() - t0)
print("loop median ms", sorted(t)[10] * 1000)
