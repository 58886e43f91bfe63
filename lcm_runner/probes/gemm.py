"""Matrix-product throughput per local device: C = A @ B, n x n, FLOPs = 2 n^3 per product.

GPU: bf16 at n = gemm_n (default 8192), warm-up products for 1 s (at least 10: the clocks settle),
then 100 timed with CUDA events, on each local GPU in turn. CPU: fp32 at n = 1024 (bf16 on CPU
measures a slow path, not the machine).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from .result import ProbeResult, evaluate
from .timing import Device, each_device, release, time_per_call

UNIT = "TFLOP/s"
CPU_N = 1024
GPU_WARMUP, GPU_REPEATS, GPU_WARMUP_S = 10, 100, 1.0
CPU_WARMUP, CPU_REPEATS = 2, 5


@dataclass(frozen=True)
class GemmMeasurement:
    device: str
    n: int
    dtype: str
    warmup: int  # at least this many untimed products
    warmup_s: float  # and for at least this long
    repeats: int
    seconds_per_product: float
    tflops: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def gemm_flops(n: int) -> float:
    return 2.0 * n**3


def measure(device: Device, n: int, warmup: int | None = None, repeats: int | None = None) -> GemmMeasurement:
    dev = torch.device(device.torch_device)
    gpu = dev.type == "cuda"
    dtype = torch.bfloat16 if gpu else torch.float32
    warmup = (GPU_WARMUP if gpu else CPU_WARMUP) if warmup is None else warmup
    repeats = (GPU_REPEATS if gpu else CPU_REPEATS) if repeats is None else repeats
    warmup_s = GPU_WARMUP_S if gpu else 0.0
    gen = torch.Generator(device=dev).manual_seed(0)
    bufs = [torch.randn(n, n, device=dev, dtype=dtype, generator=gen) for _ in range(2)]
    bufs.append(torch.empty(n, n, device=dev, dtype=dtype))
    try:
        product = lambda: torch.matmul(bufs[0], bufs[1], out=bufs[2])  # noqa: E731
        sec = time_per_call(product, dev, warmup, repeats, warmup_s)
    finally:
        bufs.clear()
        release(dev)
    return GemmMeasurement(
        device.label,
        n,
        str(dtype).removeprefix("torch."),
        warmup,
        warmup_s,
        repeats,
        sec,
        gemm_flops(n) / sec / 1e12,
    )


def run(devices: list[Device], n: int, threshold: float, ratio: float) -> ProbeResult:
    t0 = time.monotonic()
    values, errors, runs = each_device(devices, lambda d: measure(d, n), "tflops")
    res = evaluate("gemm", UNIT, values, threshold, ratio, [d.label for d in devices], errors)
    res.details = {
        "n": n,
        "dtype": "bfloat16" if devices[0].torch_device != "cpu" else "float32",
        "flops_per_product": gemm_flops(n),
        "measurements": runs,
    }
    res.duration_s = round(time.monotonic() - t0, 3)
    return res
