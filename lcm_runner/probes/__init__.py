"""Burn-in probes (`lcm-runner probe`, docs/probes.md): what a node's GPUs and fabric deliver, against
the figures its cluster spec expects.

    gemm       bf16 matrix product per local GPU (TFLOP/s); fp32 at a small size on CPU
    copy       device-to-device copy per local GPU (GB/s, bytes read + written); host memory on CPU
    allreduce  bus-bandwidth sweep like nccl-tests' all_reduce_perf, one node or several

Modules by concern: expect (the expectation file), result (a check's outcome and the threshold
comparison), timing (devices, CUDA-event timing, versions), gemm / copy / allreduce (the measurements),
peers (the comparison with the other nodes' results), report (JSON and Markdown), cli (the command).
Only gemm, copy, allreduce and timing import torch; the rest works on a controller without it.
"""

from __future__ import annotations

from .expect import Expectation, ExpectationError, load_expectation
from .result import ProbeResult

__all__ = ["Expectation", "ExpectationError", "ProbeResult", "load_expectation"]
