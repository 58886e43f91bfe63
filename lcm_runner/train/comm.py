"""Communication time per collective: every torch.distributed call of a step, timed and named by its
process group and operation, under the phase of the step that made it
(`fwd-bwd:ep.all_to_all_single`, `fwd-bwd:tp.all_gather_into_tensor`, `fwd-bwd:pp.batch_isend_irecv`,
`grad:dp.all_reduce`, `loss:dp.all_reduce`, ...), so the step's communication share counts the MoE
token dispatch/combine, the sequence-parallel gathers, the pipeline transfers and the gradient
reduction, not only the latter.

How a call is timed:
- CUDA (NCCL): an event on the current stream before the call and one after it (for `async_op=True`, when
  the caller `wait()`s on the returned work); NCCL makes the current stream wait for the collective, so the
  pair spans the collective as the computation sees it, peers' skew included. The events are read once per
  step, after the step's own synchronisation (`collect()`); no extra synchronisation is added.
- CPU (gloo): the wall time of the call, plus the `wait()` of an asynchronous one. Gloo runs collectives
  on the calling thread, so this is the time the rank spent communicating or waiting for its peers; for
  pipeline receives that includes the pipeline bubble (the peer stage still computing).

`install()` wraps the functions in `torch.distributed` and the copies megatron-core binds at import
(`dist_all_gather_func`, `dist_reduce_scatter_func`); `uninstall()` restores them. Calls made outside a
`step()` are not recorded (checkpoint barriers, the stop-flag all-reduce between steps), nor calls on a
group of one rank (megatron makes some, e.g. the vocabulary-parallel cross entropy's at TP = 1).
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

# torch.distributed functions that move data between ranks.
OPS = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "_all_gather_base",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "_reduce_scatter_base",
    "all_to_all",
    "all_to_all_single",
    "broadcast",
    "reduce",
    "batch_isend_irecv",  # megatron's pipeline transfers (isend/irecv themselves stay unwrapped: P2POp
    # accepts only the real functions)
)
# module -> names megatron-core binds to a torch.distributed function at import
BOUND = {
    "megatron.core.tensor_parallel.mappings": ("dist_all_gather_func", "dist_reduce_scatter_func"),
    "megatron.core.distributed.param_and_grad_buffer": ("dist_all_gather_func", "dist_reduce_scatter_func"),
    "megatron.core.utils": ("dist_all_gather_func",),
}


def group_names() -> list[tuple[Any, str]]:
    """(process group, short name) of megatron's parallel groups, most specific first."""
    from megatron.core import parallel_state as ps

    getters: list[tuple[str, Callable[[], Any]]] = [
        ("tp", ps.get_tensor_model_parallel_group),
        ("pp", ps.get_pipeline_model_parallel_group),
        ("ep", ps.get_expert_model_parallel_group),
        ("etp", ps.get_expert_tensor_parallel_group),
        ("dp", ps.get_data_parallel_group),
        ("dp", lambda: ps.get_data_parallel_group(with_context_parallel=True)),
        ("edp", ps.get_expert_data_parallel_group),
        ("tp-ep", ps.get_expert_tensor_and_model_parallel_group),
        ("embd", ps.get_embedding_group),
        ("mp", ps.get_model_parallel_group),
    ]
    out: list[tuple[Any, str]] = []
    for name, get in getters:
        try:
            g = get()
        except (AssertionError, RuntimeError, AttributeError):
            continue
        if g is not None and all(g is not seen for seen, _ in out):
            out.append((g, name))
    return out


class _TimedWork:
    """The work handle of an asynchronous call: its `wait()` closes the timing."""

    def __init__(self, work: Any, done: Callable[[], None]) -> None:
        self._work, self._done, self._closed = work, done, False

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        out = self._work.wait(*args, **kwargs)
        if not self._closed:
            self._closed = True
            self._done()
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


@dataclass
class CommTimer:
    device: str  # "cuda" or "cpu"
    _groups: list[tuple[Any, str]] = field(default_factory=list)
    _saved: list[tuple[Any, str, Any]] = field(default_factory=list)
    _active: bool = False
    _phase: str = ""
    _depth: int = 0  # > 0 inside a timed call: a collective it makes itself is not counted twice
    _cpu: dict[str, float] = field(default_factory=dict)
    _events: list[tuple[str, Any, Any]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)

    # ---- installation ---------------------------------------------------------------------------
    def install(self) -> None:
        if self._saved:
            return
        self._groups = group_names()
        wrapped: dict[int, Any] = {}
        for op in OPS:
            fn = getattr(dist, op, None)
            if fn is None:
                continue
            w = self._wrap(op, fn)
            wrapped[id(fn)] = w
            self._saved.append((dist, op, fn))
            setattr(dist, op, w)
        for modname, names in BOUND.items():
            try:
                mod = importlib.import_module(modname)
            except ImportError:
                continue
            for name in names:
                fn = getattr(mod, name, None)
                if fn is not None and id(fn) in wrapped:
                    self._saved.append((mod, name, fn))
                    setattr(mod, name, wrapped[id(fn)])

    def uninstall(self) -> None:
        for obj, name, fn in reversed(self._saved):
            setattr(obj, name, fn)
        self._saved.clear()

    @staticmethod
    def _group(op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        group = kwargs.get("group")
        if group is None and op == "batch_isend_irecv" and args and args[0]:
            group = getattr(args[0][0], "group", None)
        if group is None:
            for a in args:
                if isinstance(a, dist.ProcessGroup):
                    group = a
                    break
        return group

    def _name(self, op: str, group: Any) -> str:
        label = "world"
        if group is not None:
            label = next((n for g, n in self._groups if g is group), "other")
        return f"{self._phase}:{label}.{op}" if self._phase else f"{label}.{op}"

    def _wrap(self, op: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self._active or self._depth:
                return fn(*args, **kwargs)
            group = self._group(op, args, kwargs)
            size = group.size() if group is not None else dist.get_world_size()
            if size == 1:  # no other rank: nothing is communicated
                return fn(*args, **kwargs)
            name = self._name(op, group)
            self.counts[name] = self.counts.get(name, 0) + 1
            start = self._mark()
            self._depth += 1
            try:
                out = fn(*args, **kwargs)
            finally:
                self._depth -= 1
            if out is None:
                self._close(name, start)
                return out
            if isinstance(out, list):  # batch_isend_irecv: a work per op; the last wait closes it
                pending = [len(out)]

                def one_done() -> None:
                    pending[0] -= 1
                    if pending[0] == 0:
                        self._close(name, start)

                return [_TimedWork(w, one_done) for w in out]
            return _TimedWork(out, lambda: self._close(name, start))

        timed.__wrapped__ = fn  # type: ignore[attr-defined]
        timed.__name__ = getattr(fn, "__name__", op)
        return timed

    def _mark(self) -> Any:
        if self.device == "cuda":
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def _close(self, name: str, start: Any) -> None:
        if self.device == "cuda":
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._events.append((name, start, end))
        else:
            self._cpu[name] = self._cpu.get(name, 0.0) + time.perf_counter() - start

    # ---- per step -------------------------------------------------------------------------------
    @contextmanager
    def step(self) -> Iterator[None]:
        """Record the collectives called inside; read them with `collect()` after the step synchronised."""
        self._cpu.clear()
        self._events.clear()
        self.counts = {}
        self._active = True
        try:
            yield
        finally:
            self._active = False

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Prefix the collectives called inside with `name:` (`grad:dp.all_reduce`)."""
        outer, self._phase = self._phase, name
        try:
            yield
        finally:
            self._phase = outer

    def collect(self) -> dict[str, float]:
        """Seconds per collective of the last step (the device must have reached the step's end)."""
        out = dict(self._cpu)
        for name, start, end in self._events:
            end.synchronize()
            out[name] = out.get(name, 0.0) + start.elapsed_time(end) / 1000.0
        self._events.clear()
        return {k: round(v, 6) for k, v in sorted(out.items())}
