"""CPU shims for megatron-core (applied only when training on CPU with gloo).

megatron-core's MoE path and checkpoint code call CUDA-only APIs. These shims redirect exactly the
calls seen on the code paths this engine uses (see docs/training.md). Each shim names the
megatron-core attribute it replaces; `check_targets()` verifies every one still exists with the
expected shape, so a megatron-core upgrade that changes them fails loudly
(tests/unit/test_train_cpu_compat.py) instead of silently training something else.

Two entry points:
- `stub_triton_kernels()`: before megatron is imported, when `triton` is not installed.
- `apply()`: after `import torch`, before the model is built; idempotent.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
import types
from dataclasses import dataclass
from typing import Any

import torch

# megatron-core version these shims were written against (requirements/megatron.lock pins it).
MCORE_VERSION = "0.19.2"

# megatron.core.transformer.moe.ops.paged_stash imports triton unconditionally; nothing on our path calls it.
_TRITON_KERNEL_MODULE = "megatron.core.transformer.moe.ops.paged_stash"

_applied = False


@dataclass(frozen=True)
class ShimTarget:
    """One thing a shim replaces: `module.attr` must exist and (if given) take these parameters."""

    module: str
    attr: str
    params: tuple[str, ...] | None = None
    why: str = ""


# What apply() patches, and what megatron-core must still call for the patches to be the right ones.
TARGETS: tuple[ShimTarget, ...] = (
    ShimTarget(
        "megatron.core.transformer.moe.token_dispatcher",
        "maybe_move_tensor_to_cpu",
        ("tensor", "as_numpy", "record_stream"),
        "all_to_all split sizes must be numpy on CPU; the helper only converts CUDA tensors",
    ),
    ShimTarget(
        "megatron.core.transformer.moe.token_dispatcher",
        "MoEAlltoAllTokenDispatcher",
        None,
        "uses torch.cuda.Stream / current_stream / stream / record_event for its D2H copies",
    ),
    ShimTarget(
        "megatron.core.transformer.moe.router",
        "TopKRouter",
        None,
        "moves its weight to torch.cuda.current_device() on every forward",
    ),
    ShimTarget(
        "megatron.core.tensor_parallel.random",
        "model_parallel_cuda_manual_seed",
        ("seed", "te_rng_tracker", "inference_rng_tracker"),
        "the default RNG tracker calls torch.cuda.get_rng_state; the inference tracker does not",
    ),
    ShimTarget(
        "megatron.core.pipeline_parallel.schedules",
        "torch",
        None,
        'allocates its token counter with torch.zeros(..., device="cuda") in every schedule',
    ),
    ShimTarget(
        "megatron.core.dist_checkpointing.strategies.async_utils",
        "TemporalAsyncCaller",
        None,
        "calls torch.cuda.synchronize and all_reduces a tensor on torch.cuda.current_device()",
    ),
)


class _CPUStream(torch.cpu.Stream):
    """torch.cpu.Stream whose record_event() returns a (no-op) CPU event, as the dispatcher expects."""

    def record_event(self, event: Any = None) -> torch.cpu.Event:
        return torch.cpu.Event()


_STREAM: _CPUStream | None = None


def _current_stream(device: Any = None) -> _CPUStream:
    global _STREAM
    if _STREAM is None:
        _STREAM = _CPUStream()
    return _STREAM


def _cpu_stream_ctx(stream: Any = None) -> Any:
    return torch.cpu.stream(stream)


def _cpu_numpy_or_tensor(tensor: Any, as_numpy: bool = False, record_stream: bool = False) -> Any:
    """maybe_move_tensor_to_cpu for CPU tensors: gloo's all_to_all_single wants list/numpy split sizes."""
    if as_numpy and torch.is_tensor(tensor):
        return tensor.numpy()
    return tensor


class _TorchOnCPU(types.ModuleType):
    """`torch` as megatron's schedules see it: the same module, except that `torch.zeros(...,
    device="cuda")` (their per-step token counter, the only tensor they create) is created on the CPU."""

    def __init__(self) -> None:
        super().__init__("torch")

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    @staticmethod
    def _cpu(kwargs: dict[str, Any]) -> dict[str, Any]:
        dev = kwargs.get("device")
        if dev == "cuda" or (isinstance(dev, torch.device) and dev.type == "cuda"):
            kwargs = dict(kwargs, device="cpu")
        return kwargs

    def zeros(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return torch.zeros(*args, **self._cpu(kwargs))


_ALL_GATHER = torch.distributed.all_gather


def _all_gather_uneven(tensor_list: list[torch.Tensor], tensor: torch.Tensor, group: Any = None,
                       async_op: bool = False) -> Any:  # fmt: skip
    """torch.distributed.all_gather for gloo, which requires equal sizes: megatron's token dispatcher
    gathers each rank's (different) number of tokens over the expert-TP group. Uneven first dimensions
    are padded to the largest, gathered, and copied out; everything else goes to the real function."""
    shapes = [t.shape for t in tensor_list]
    if len({tuple(s) for s in shapes}) <= 1 or any(tuple(s[1:]) != tuple(tensor.shape[1:]) for s in shapes):
        return _ALL_GATHER(tensor_list, tensor, group=group, async_op=async_op)
    rows = max(s[0] for s in shapes)
    padded = tensor.new_zeros((rows, *tensor.shape[1:]))
    padded[: tensor.shape[0]] = tensor
    bufs = [tensor.new_empty((rows, *tensor.shape[1:])) for _ in shapes]
    work = _ALL_GATHER(bufs, padded, group=group, async_op=async_op)
    if work is not None:
        work.wait()
    for out, buf, shape in zip(tensor_list, bufs, shapes, strict=True):
        out.copy_(buf[: shape[0]])
    return work


def stub_triton_kernels() -> bool:
    """Register an empty module for megatron's triton-only MoE kernels when triton is missing.

    Only that one module is stubbed: a global `triton` stub breaks torch._dynamo. Returns True if stubbed.
    """
    if importlib.util.find_spec("triton") is not None or _TRITON_KERNEL_MODULE in sys.modules:
        return False
    stub = types.ModuleType(_TRITON_KERNEL_MODULE)
    stub.GLOBAL_BLOCK_SIZE = 1024  # type: ignore[attr-defined]

    def _unavailable(*_a: Any, **_k: Any) -> None:
        raise RuntimeError("MoE paged stash kernels need triton (CUDA); not available on CPU")

    stub.paged_stash_copy_kernel = _unavailable  # type: ignore[attr-defined]
    stub.paged_stash_pop_kernel = _unavailable  # type: ignore[attr-defined]
    stub.__all__ = ["GLOBAL_BLOCK_SIZE", "paged_stash_copy_kernel", "paged_stash_pop_kernel"]  # type: ignore[attr-defined]
    sys.modules[_TRITON_KERNEL_MODULE] = stub
    return True


def check_targets() -> list[str]:
    """Problems with the shim targets in the installed megatron-core (empty list = shims still fit)."""
    problems: list[str] = []
    for t in TARGETS:
        try:
            mod = importlib.import_module(t.module)
        except ImportError as e:  # pragma: no cover - reported, not raised
            problems.append(f"{t.module}: cannot import ({e})")
            continue
        obj = getattr(mod, t.attr, None)
        if obj is None:
            problems.append(f"{t.module}.{t.attr} is gone ({t.why})")
            continue
        if t.params is not None:
            got = tuple(inspect.signature(obj).parameters)
            if got[: len(t.params)] != t.params:
                problems.append(f"{t.module}.{t.attr} signature changed: {got} (expected {t.params})")
    # The code paths the torch.cuda shims exist for must still use those APIs; if megatron stops
    # calling them the shim is dead weight, if it calls something new the run fails visibly.
    src_checks = {
        "megatron.core.transformer.moe.token_dispatcher": ("torch.cuda.Stream()", "record_event()"),
        "megatron.core.transformer.moe.router": ("torch.cuda.current_device()",),
        "megatron.core.dist_checkpointing.strategies.async_utils": ("torch.cuda.synchronize()",),
        "megatron.core.pipeline_parallel.schedules": ('torch.zeros([], dtype=torch.int, device="cuda")',),
        "megatron.core.tensor_parallel.mappings": (
            "torch.distributed.all_gather(output_tensor_list, input_",
        ),
    }
    for modname, needles in src_checks.items():
        src = inspect.getsource(importlib.import_module(modname))
        for needle in needles:
            if needle not in src:
                problems.append(f"{modname} no longer calls {needle}: review lcm_runner.train.cpu_compat")
    return problems


def apply() -> None:
    """Redirect megatron-core's CUDA-only calls to CPU equivalents. Call only for a CPU run."""
    global _applied
    if _applied:
        return
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        # A CUDA machine forced onto CPU still works, but patching torch.cuda would break CUDA users
        # in the same process; refuse rather than surprise.
        raise RuntimeError("cpu_compat.apply() on a machine with CUDA: run with --device cuda")
    problems = check_targets()
    if problems:
        raise RuntimeError(
            f"megatron-core {MCORE_VERSION} CPU shims no longer match the installed megatron-core:\n  "
            + "\n  ".join(problems)
        )
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment,return-value]
    torch.cuda.Stream = _CPUStream  # type: ignore[misc,assignment]
    torch.cuda.current_stream = _current_stream  # type: ignore[assignment]
    torch.cuda.stream = _cpu_stream_ctx  # type: ignore[assignment]
    torch.cuda.synchronize = lambda device=None: None  # type: ignore[assignment]
    td = importlib.import_module("megatron.core.transformer.moe.token_dispatcher")
    td.maybe_move_tensor_to_cpu = _cpu_numpy_or_tensor  # type: ignore[attr-defined]
    schedules = importlib.import_module("megatron.core.pipeline_parallel.schedules")
    schedules.torch = _TorchOnCPU()  # type: ignore[attr-defined]
    torch.distributed.all_gather = _all_gather_uneven  # type: ignore[assignment]
    _applied = True


def is_applied() -> bool:
    return _applied
