"""All-reduce bus bandwidth, reported like nccl-tests' all_reduce_perf.

For each size S (bytes of float32, doubling): one all-reduce (sum of ones) checked for the right
answer, `warmup` untimed, then `iters` timed together; per size

    time   = the ranks' average of (their elapsed time / iters)        (nccl-tests' default, -a 1)
    algbw  = S / time                                                  GB/s, 1 GB = 1e9 bytes
    busbw  = algbw x 2 (n - 1) / n                                     n = ranks in the all-reduce

busbw is the figure a ring's links carry, comparable across rank counts. The figure compared with the
threshold is the busbw at the largest size of the sweep (the small sizes measure latency).

One node: one process per local GPU (NCCL), a rendezvous on 127.0.0.1 at a free port; on CPU two gloo
processes. Across nodes: the same command on every node at once (Ansible, srun) with nnodes, node_rank
and the master's ADDR:PORT (torch.distributed TCP init); one process per GPU, or one gloo process per
node on CPU; every node must have the same number of GPUs. Sizes: 1 MiB .. allreduce_max_mib on GPU,
64 KiB .. 8 MiB on CPU. The environment (NCCL_*, GLOO_SOCKET_IFNAME ...) is the caller's, inherited.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from .result import FAIL, PASS, SKIP, ProbeResult, fmt

UNIT = "GB/s"
GPU_MIN_BYTES = 2**20
DEFAULT_GPU_MAX_MIB = 1024
CPU_MIN_BYTES, CPU_MAX_BYTES = 64 * 2**10, 8 * 2**20
GPU_WARMUP, GPU_ITERS = 5, 20
CPU_WARMUP, CPU_ITERS = 2, 10
CPU_LOCAL_PROCS_ONE_NODE = 2
ONE_RANK_REASON = "1 GPU on this node: an all-reduce needs at least 2 ranks; no figure"


def algbw_gbps(size_bytes: int, seconds: float) -> float:
    return size_bytes / seconds / 1e9


def busbw_factor(nranks: int) -> float:
    return 2.0 * (nranks - 1) / nranks


def busbw_gbps(size_bytes: int, seconds: float, nranks: int) -> float:
    return algbw_gbps(size_bytes, seconds) * busbw_factor(nranks)


def sweep_sizes(min_bytes: int, max_bytes: int) -> list[int]:
    sizes, s = [], min_bytes
    while s <= max_bytes:
        sizes.append(s)
        s *= 2
    return sizes


@dataclass(frozen=True)
class SweepConfig:
    backend: str  # nccl | gloo
    master_addr: str
    master_port: int
    nnodes: int
    node_rank: int
    local_world: int  # processes on this node
    sizes: list[int]
    warmup: int
    iters: int
    timeout_s: float

    @property
    def world(self) -> int:
        return self.nnodes * self.local_world


@dataclass(frozen=True)
class SweepRow:
    size_bytes: int
    count: int  # float32 elements
    time_us: float
    algbw_gbps: float
    busbw_gbps: float


@dataclass
class Sweep:
    world: int
    backend: str
    rows: list[SweepRow] = field(default_factory=list)
    wrong_sizes: list[int] = field(default_factory=list)  # sizes whose all-reduce gave a wrong sum
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def rows_from_times(sizes: list[int], seconds: list[float], nranks: int) -> list[SweepRow]:
    return [
        SweepRow(
            s,
            s // 4,
            round(t * 1e6, 3),
            algbw_gbps(s, t),
            busbw_gbps(s, t, nranks),
        )
        for s, t in zip(sizes, seconds, strict=True)
    ]


def size_label(size_bytes: int) -> str:
    if size_bytes >= 2**30 and size_bytes % 2**30 == 0:
        return f"{size_bytes // 2**30} GiB"
    if size_bytes >= 2**20 and size_bytes % 2**20 == 0:
        return f"{size_bytes // 2**20} MiB"
    return f"{size_bytes / 2**10:g} KiB"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _timed_loop(op: Any, t: torch.Tensor, device: torch.device, iters: int) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            op(t)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        op(t)
    return (time.perf_counter() - t0) / iters


def _sweep_in_group(cfg: SweepConfig, device: torch.device) -> tuple[list[float], list[int]]:
    """Run inside an initialised process group: (the ranks' average seconds per size, wrong sizes)."""
    import torch.distributed as dist

    world = dist.get_world_size()
    buf = torch.empty(cfg.sizes[-1] // 4, dtype=torch.float32, device=device)
    mine: list[float] = []
    wrong: list[float] = []
    for size in cfg.sizes:
        t = buf[: size // 4]
        t.fill_(1.0)
        dist.all_reduce(t)
        wrong.append(0.0 if bool((t == float(world)).all()) else 1.0)
        t.zero_()  # the timed sums stay 0 (no overflow to inf over many iterations)
        for _ in range(cfg.warmup):
            dist.all_reduce(t)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dist.barrier()
        mine.append(_timed_loop(dist.all_reduce, t, device, cfg.iters))
    del buf
    summed = torch.tensor(mine + wrong, dtype=torch.float64, device=device)
    dist.all_reduce(summed)  # sum over ranks: times -> average below; wrong flags -> any rank
    vals = summed.tolist()
    n = len(cfg.sizes)
    avg = [v / world for v in vals[:n]]
    return avg, [s for s, w in zip(cfg.sizes, vals[n:], strict=True) if w > 0]


def worker(local_rank: int, cfg: SweepConfig, out_path: str) -> None:
    """One rank (torch.multiprocessing.spawn's index = the local rank = the GPU it uses)."""
    import torch.distributed as dist

    rank = cfg.node_rank * cfg.local_world + local_rank
    timeout = datetime.timedelta(seconds=cfg.timeout_s)
    host = f"[{cfg.master_addr}]" if ":" in cfg.master_addr else cfg.master_addr  # an IPv6 address
    init = f"tcp://{host}:{cfg.master_port}"
    if cfg.backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3")  # abort on a timeout, do not hang
        dist.init_process_group(
            "nccl", init_method=init, rank=rank, world_size=cfg.world, timeout=timeout, device_id=device
        )
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=cfg.world, timeout=timeout)
    try:
        t0 = time.monotonic()
        avg, wrong = _sweep_in_group(cfg, device)
        if local_rank == 0:
            sweep = Sweep(cfg.world, cfg.backend, rows_from_times(cfg.sizes, avg, cfg.world), wrong)
            sweep.seconds = round(time.monotonic() - t0, 3)
            Path(out_path).write_text(json.dumps(sweep.to_dict()), encoding="utf-8")
    finally:
        dist.destroy_process_group()
        if device.type == "cuda":
            torch.cuda.empty_cache()


def run_sweep(cfg: SweepConfig) -> Sweep:
    """This node's processes of the all-reduce: spawned (several), or this process (one)."""
    with tempfile.TemporaryDirectory(prefix="lcm-probe-") as tmp:
        out = Path(tmp) / "sweep.json"
        if cfg.local_world == 1:
            worker(0, cfg, str(out))
        else:
            import torch.multiprocessing as mp

            mp.spawn(worker, args=(cfg, str(out)), nprocs=cfg.local_world, join=True)
        doc = json.loads(out.read_text(encoding="utf-8"))
    rows = [SweepRow(**r) for r in doc.pop("rows")]
    return Sweep(rows=rows, **doc)


def plan(
    gpus: int,
    nnodes: int,
    node_rank: int,
    master: tuple[str, int] | None,
    max_mib: int | None,
    timeout_s: float,
) -> SweepConfig | str:
    """The sweep this node takes part in, or why there is none (the skip reason)."""
    if gpus == 1 and nnodes == 1:
        return ONE_RANK_REASON
    if gpus >= 1:
        top = (max_mib or DEFAULT_GPU_MAX_MIB) * 2**20
        backend, local, sizes = "nccl", gpus, sweep_sizes(GPU_MIN_BYTES, top)
        warmup, iters = GPU_WARMUP, GPU_ITERS
    else:
        backend, local = "gloo", (CPU_LOCAL_PROCS_ONE_NODE if nnodes == 1 else 1)
        sizes = sweep_sizes(CPU_MIN_BYTES, max_mib * 2**20 if max_mib else CPU_MAX_BYTES)
        warmup, iters = CPU_WARMUP, CPU_ITERS
    if not sizes:
        return f"allreduce max {max_mib} MiB: below the sweep's first size"
    addr, port = master if master else ("127.0.0.1", free_port())
    return SweepConfig(backend, addr, port, nnodes, node_rank, local, sizes, warmup, iters, timeout_s)


def result_of(sweep: Sweep, cfg: SweepConfig, threshold: float) -> ProbeResult:
    scope = "cluster" if cfg.nnodes > 1 else "node"
    last = sweep.rows[-1]
    res = ProbeResult("allreduce", PASS, last.busbw_gbps, threshold, UNIT, "", scope=scope)
    at = f"busbw at {size_label(last.size_bytes)} over {sweep.world} ranks"
    if sweep.wrong_sizes:
        res.fail(f"wrong all-reduce result at sizes {sweep.wrong_sizes} bytes")
    if last.busbw_gbps < threshold:
        res.fail(f"{at}: {fmt(last.busbw_gbps)} {UNIT} < threshold {fmt(threshold)} {UNIT}")
    if res.status == PASS:
        res.reason = (
            f"{at}: {fmt(last.busbw_gbps)} {UNIT} >= threshold {fmt(threshold)} {UNIT}"
            if threshold > 0
            else f"{at}: {fmt(last.busbw_gbps)} {UNIT}; threshold 0: recorded, no floor"
        )
    return res


def run(
    gpus: int,
    nnodes: int,
    node_rank: int,
    master: tuple[str, int] | None,
    max_mib: int | None,
    threshold: float,
    timeout_s: float = 300.0,
) -> ProbeResult:
    t0 = time.monotonic()
    cfg = plan(gpus, nnodes, node_rank, master, max_mib, timeout_s)
    scope = "cluster" if nnodes > 1 else "node"
    if isinstance(cfg, str):
        return ProbeResult("allreduce", SKIP, None, threshold, UNIT, cfg, scope=scope)
    details: dict[str, Any] = {
        "backend": cfg.backend,
        "ranks": cfg.world,
        "nnodes": cfg.nnodes,
        "node_rank": cfg.node_rank,
        "local_ranks": cfg.local_world,
        "master": f"{cfg.master_addr}:{cfg.master_port}",
        "dtype": "float32",
        "op": "sum",
        "warmup": cfg.warmup,
        "iters": cfg.iters,
        "compared": "busbw at the largest size",
    }
    try:
        sweep = run_sweep(cfg)
    except Exception as e:  # a rank failed (spawn's ProcessRaisedException), the rendezvous timed out
        lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
        why = lines[-1] if lines else type(e).__name__
        res = ProbeResult("allreduce", FAIL, None, threshold, UNIT, f"the all-reduce failed: {why}", scope)
        res.details = details
        res.duration_s = round(time.monotonic() - t0, 3)
        return res
    res = result_of(sweep, cfg, threshold)
    details["rows"] = [asdict(r) for r in sweep.rows]
    details["wrong_sizes"] = sweep.wrong_sizes
    details["sweep_s"] = sweep.seconds
    res.details = details
    res.duration_s = round(time.monotonic() - t0, 3)
    return res


def format_rows(rows: list[dict[str, Any]]) -> list[str]:
    """The sweep as all_reduce_perf prints it (out-of-place columns only)."""
    out = [
        f"#{'size':>12} {'count':>12} {'type':>6} {'time(us)':>10} {'algbw(GB/s)':>12} {'busbw(GB/s)':>12}"
    ]
    for r in rows:
        out.append(
            f" {r['size_bytes']:>12} {r['count']:>12} {'float':>6} {r['time_us']:>10.1f} "
            f"{r['algbw_gbps']:>12.2f} {r['busbw_gbps']:>12.2f}"
        )
    return out
