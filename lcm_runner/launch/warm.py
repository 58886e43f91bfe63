"""A warm rank: the child half of the agent's warm spares (lcm_runner.launch.agent.spares).

A fork of the agent's zygote made while the ranks train. It does now what a rank started after a failure
would otherwise do on the recovery's critical path, before it knows which rank it will be: on a GPU, the
CUDA context on its device and the cuBLAS handles (a first matmul in each dtype the trainer uses). Then it
waits on a pipe. At a restart the agent writes the rank's torchrun environment and log path as one JSON
object and closes the pipe; the spare becomes that rank (zygote.run_module, the same `python -m` semantics
as a forked rank). EOF without an order means it is not needed: it exits 0.

What it never does before the order: join a process group, read a checkpoint, build the model. Those
depend on the generation (its rendezvous port) and on the checkpoint `latest` names at the restart.
The CUDA context costs GPU memory (a few hundred MiB per spare) for the whole run; see docs/training.md,
"Fast process restarts".
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, NoReturn

from lcm_runner.launch import procs, zygote

SPARE_COMM = "lcm-spare"  # a waiting spare's comm: procs.Proc.is_trainer is false for it


def prepare(local_rank: int) -> float:
    """Initialise what a new rank of `local_rank` would initialise first; seconds taken. On a machine
    without CUDA there is nothing to do (the imports are the zygote's already)."""
    t0 = time.monotonic()
    import torch

    if not torch.cuda.is_available():
        return 0.0
    torch.cuda.set_device(local_rank)
    for dtype in (torch.bfloat16, torch.float32):
        a = torch.ones(128, 128, device="cuda", dtype=dtype)
        (a @ a).sum().item()  # the context, the allocator's first block, cuBLAS(Lt) handle and workspace
    torch.cuda.synchronize()
    return time.monotonic() - t0


def read_order(fd: int) -> dict[str, Any] | None:
    """Block until the agent writes the order and closes the pipe; None on EOF without one."""
    chunks: list[bytes] = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except InterruptedError:
            continue
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    data = b"".join(chunks).strip()
    return json.loads(data) if data else None


def order_bytes(env: dict[str, str], log: Path | None) -> bytes:
    """What the agent writes to a spare: the rank's environment and its log file."""
    return json.dumps({"env": env, "log": str(log) if log is not None else None}).encode() + b"\n"


def run_spare(
    module: str,
    args: list[str],
    local_rank: int,
    pre_env: dict[str, str],
    fd: int,
    close_fds: list[int],
    reset: tuple[int, ...],
) -> NoReturn:
    """The spare's whole life, in the forked child: prepare, wait for the order, become the rank."""
    try:
        zygote.become_rank(reset, name=SPARE_COMM)
        for other in close_fds:  # the pipes of the other spares: theirs must see EOF when the agent closes
            os.close(other)
        os.environ.update(pre_env)
        took = prepare(local_rank)
        if os.environ.get("LCM_WARM_DEBUG"):
            print(f"lcm-spare local {local_rank}: ready in {took:.3f}s", file=sys.stderr, flush=True)
        order = read_order(fd)
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    if order is None:
        os._exit(0)
    zygote.set_name(procs.TRAINER_COMM)
    log = order.get("log")
    zygote.run_module(module, args, dict(order["env"]), Path(log) if log else None)
