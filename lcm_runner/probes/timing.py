"""The local devices, timing a repeated operation (CUDA events on a GPU, perf_counter on CPU), and the
software versions a result records."""

from __future__ import annotations

import os
import platform
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

# Environment the results record (never set or changed here: the probes inherit the caller's).
RECORDED_ENV = (
    "NCCL_",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "GLOO_",
    "TORCH_NCCL_",
    "OMP_NUM_THREADS",
)


@dataclass(frozen=True)
class Device:
    label: str  # "GPU 0" | "cpu"
    torch_device: str  # "cuda:0" | "cpu"
    name: str  # "NVIDIA H200" | the CPU
    memory_gib: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def local_devices() -> list[Device]:
    """Every CUDA device this process sees, else the CPU (one device)."""
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        out = []
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            out.append(Device(f"GPU {i}", f"cuda:{i}", props.name, round(props.total_memory / 2**30, 1)))
        return out
    cpu = platform.processor() or platform.machine() or "cpu"
    return [Device("cpu", "cpu", f"{cpu} ({os.cpu_count()} cores, {torch.get_num_threads()} torch threads)")]


def uses_gpu(devices: list[Device]) -> bool:
    return devices[0].torch_device.startswith("cuda")


def time_per_call(
    fn: Callable[[], object], device: torch.device, warmup: int, repeats: int, warmup_s: float = 0.0
) -> float:
    """Seconds per call of fn: `warmup` calls untimed (and more until `warmup_s` seconds have passed:
    the clocks and the power state settle), then `repeats` calls timed together (CUDA events on the
    device's current stream after a synchronize; the host clock on CPU)."""
    t_warm = time.perf_counter()
    done = 0
    while done < warmup or time.perf_counter() - t_warm < warmup_s:
        fn()
        done += 1
        if device.type == "cuda" and done >= warmup and warmup_s > 0:
            torch.cuda.synchronize(device)  # the host clock measures the GPU's work, not the queueing
    if device.type == "cuda":
        with torch.cuda.device(device):
            torch.cuda.synchronize(device)
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(repeats):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3 / repeats  # elapsed_time: milliseconds
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats


def release(device: torch.device) -> None:
    """Give the cached blocks of a finished probe back (the next probe's large buffers need them)."""
    if device.type == "cuda":
        with torch.cuda.device(device):
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()


def nccl_version() -> str | None:
    if not torch.cuda.is_available():
        return None
    try:
        v = torch.cuda.nccl.version()
    except Exception:  # a build without NCCL
        return None
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def environment(devices: list[Device]) -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": nccl_version(),
        "device_type": "cuda" if uses_gpu(devices) else "cpu",
        "devices": [d.to_dict() for d in devices],
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(RECORDED_ENV)},
    }


def each_device(
    devices: list[Device], measure: Callable[[Device], Any], figure: str
) -> tuple[list[float | None], list[str | None], list[dict[str, Any]]]:
    """Run measure(device) on every device: its `figure` attribute (None where it failed), the error of each
    (a CUDA error or out of memory, first line), and the measurements' dicts."""
    values: list[float | None] = []
    errors: list[str | None] = []
    runs: list[dict[str, Any]] = []
    for d in devices:
        try:
            m = measure(d)
        except (RuntimeError, torch.cuda.OutOfMemoryError) as e:  # CUDA errors, out of memory
            values.append(None)
            errors.append(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            release(torch.device(d.torch_device))
            continue
        values.append(getattr(m, figure))
        errors.append(None)
        runs.append(m.to_dict())
    return values, errors, runs
