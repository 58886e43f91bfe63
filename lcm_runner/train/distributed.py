"""The device and the process group: CUDA + NCCL or CPU + gloo, under torchrun, srun or alone."""

from __future__ import annotations

import datetime
import os
import socket
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from .args import ArgError, TrainArgs


def resolve_device(args: TrainArgs) -> str:
    if args.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ArgError("--device cuda: no CUDA device is visible to this process")
    return args.device


def _default_single_process_env() -> None:
    """Allow `python -m lcm_runner.train ...` without torchrun: a world of one on loopback."""
    if "RANK" in os.environ:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(
        {
            "RANK": "0",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
    )


@dataclass(frozen=True)
class GroupStore:
    """A process group's store and place given by the caller (in-process restart: a fresh prefix of
    NVRx's store per iteration, and the rank NVRx assigned)."""

    store: Any
    rank: int
    world_size: int


def init_distributed(device: str, timeout_minutes: float, given: GroupStore | None = None) -> None:
    _default_single_process_env()
    timeout = datetime.timedelta(minutes=timeout_minutes)
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3")  # abort on timeout, do not hang
        where: dict[str, Any] = {}
        if given is not None:
            where = {"store": given.store, "rank": given.rank, "world_size": given.world_size}
        dist.init_process_group(
            "nccl", timeout=timeout, device_id=torch.device("cuda", torch.cuda.current_device()), **where
        )
        return
    if given is not None:
        dist.init_process_group(
            "gloo", store=given.store, rank=given.rank, world_size=given.world_size, timeout=timeout
        )
        return
    # torchrun shares its rendezvous TCPStore with the workers unless TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1;
    # after a restart a gloo group can then read the previous attempt's peer addresses and fail or hang.
    # One agent: namespace the keys by attempt. Several agents: the launcher must set the variable.
    shared = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    if shared and os.environ.get("GROUP_WORLD_SIZE", "1") == "1":
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout
        )
        prefixed = dist.PrefixStore(f"lcm_attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)
        dist.init_process_group(
            "gloo",
            store=prefixed,
            rank=int(os.environ["RANK"]),
            world_size=int(os.environ["WORLD_SIZE"]),
            timeout=timeout,
        )
        return
    if shared:
        print(
            "warning: torchrun shares its TCPStore with gloo workers across several agents; "
            "set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 or restarts may hang",
            flush=True,
        )
    dist.init_process_group("gloo", timeout=timeout)


def all_agree(flag: bool, device: str) -> bool:
    """True on every rank when `flag` is true on every rank (one all-reduce of an int)."""
    t = torch.tensor([1 if flag else 0], dtype=torch.int32)
    if device == "cuda":
        t = t.cuda()
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(int(t.item()))
