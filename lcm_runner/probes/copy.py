"""Memory copy bandwidth per local device: dst.copy_(src) of one buffer, GB/s = 2 x size / time
(every byte is read once and written once; 1 GB = 1e9 bytes).

GPU: device-to-device in HBM, copy_mib MiB (default 4096), 5 warm-up copies then 20 timed with CUDA
events, on each local GPU in turn. CPU: a 64 MiB host-memory copy.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from .result import ProbeResult, evaluate
from .timing import Device, each_device, release, time_per_call

UNIT = "GB/s"
CPU_MIB = 64
GPU_WARMUP, GPU_REPEATS = 5, 20
CPU_WARMUP, CPU_REPEATS = 2, 5


@dataclass(frozen=True)
class CopyMeasurement:
    device: str
    bytes: int
    warmup: int
    repeats: int
    seconds_per_copy: float
    gbps: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def copy_gbps(size_bytes: int, seconds: float) -> float:
    return 2.0 * size_bytes / seconds / 1e9


def measure(
    device: Device, mib: int, warmup: int | None = None, repeats: int | None = None
) -> CopyMeasurement:
    dev = torch.device(device.torch_device)
    gpu = dev.type == "cuda"
    warmup = (GPU_WARMUP if gpu else CPU_WARMUP) if warmup is None else warmup
    repeats = (GPU_REPEATS if gpu else CPU_REPEATS) if repeats is None else repeats
    size = mib * 2**20
    # src written once: every page is backed before the timing
    bufs = [torch.ones(size, dtype=torch.uint8, device=dev), torch.zeros(size, dtype=torch.uint8, device=dev)]
    try:
        sec = time_per_call(lambda: bufs[1].copy_(bufs[0]), dev, warmup, repeats)
        if not bool(bufs[1][-1] == 1):
            raise RuntimeError("the copy's destination does not hold the source")
    finally:
        bufs.clear()
        release(dev)
    return CopyMeasurement(device.label, size, warmup, repeats, sec, copy_gbps(size, sec))


def run(devices: list[Device], mib: int, threshold: float, ratio: float) -> ProbeResult:
    t0 = time.monotonic()
    values, errors, runs = each_device(devices, lambda d: measure(d, mib), "gbps")
    res = evaluate("copy", UNIT, values, threshold, ratio, [d.label for d in devices], errors)
    res.details = {"mib": mib, "bytes_counted": "2 x size (read + write)", "measurements": runs}
    res.duration_s = round(time.monotonic() - t0, 3)
    return res
