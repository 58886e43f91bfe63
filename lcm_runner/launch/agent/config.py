"""What one agent is told: the job's shape, its store, its timeouts, the trainer to run."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from lcm_runner.contracts import (
    DEFAULT_HB_INTERVAL_S,
    DEFAULT_HB_TIMEOUT_S,
    DEFAULT_JOIN_TIMEOUT_S,
    DEFAULT_MAX_RESTARTS,
)
from lcm_runner.launch.procs import TRAINER_MODULE


@dataclass
class AgentConfig:
    nnodes: int
    node_rank: int
    nproc_per_node: int
    master_addr: str
    master_port: int
    max_restarts: int = DEFAULT_MAX_RESTARTS
    join_timeout_s: float = DEFAULT_JOIN_TIMEOUT_S
    hb_interval_s: float = DEFAULT_HB_INTERVAL_S
    hb_timeout_s: float = DEFAULT_HB_TIMEOUT_S
    poll_s: float = 0.02  # waitpid cadence
    store_poll_s: float = 0.05  # cadence of the store check for other nodes' failures
    module: str = TRAINER_MODULE  # run as `python -m <module>` in each rank
    preload: list[str] = field(default_factory=list)
    events: Path | None = None
    log_dir: Path | None = None
    train_args: list[str] = field(default_factory=list)
    standby: bool = False  # a hot spare: preload, wait, take over a lost node's rank
    # node rank -> CUDA_VISIBLE_DEVICES of its ranks (local launcher: nodes emulated on one machine, a
    # standby without GPUs of its own runs the node it takes over on that node's devices). Empty: the
    # ranks inherit the agent's CUDA_VISIBLE_DEVICES (a real node, or a spare with its own GPUs).
    node_devices: dict[int, str] = field(default_factory=dict)
    # warm spare ranks (spares.py): one per local rank, forked warm_delay_s after each generation starts
    warm_ranks: bool = False
    warm_delay_s: float = 5.0
    # the ranks' host copy of the last checkpoint in shared memory (lcm_runner.train.ckpt_shm): a
    # directory made under host_copy_root for this agent's life, given to the ranks as $LCM_HOST_COPY_DIR
    host_copy: bool = False
    host_copy_root: Path = Path("/dev/shm")
    host_copy_dir: Path | None = None  # set by the agent when it made the directory

    def validate(self) -> None:
        if self.nnodes < 1:
            raise ValueError(f"nnodes must be >= 1, got {self.nnodes}")
        if self.standby:
            if self.nnodes < 2:
                raise ValueError(
                    "a standby agent needs nnodes >= 2 (node 0 hosts the store, it cannot be replaced)"
                )
        elif not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"node_rank {self.node_rank} must be in [0, nnodes={self.nnodes})")
        if self.nproc_per_node < 1:
            raise ValueError(f"nproc_per_node must be >= 1, got {self.nproc_per_node}")
        if not 1024 <= self.master_port <= 65535 - 1 - self.max_restarts:
            raise ValueError(
                f"master_port {self.master_port} leaves no room for {self.max_restarts} restarts"
            )
        if self.max_restarts < 0:
            raise ValueError("max_restarts must be >= 0")
        if self.hb_timeout_s <= 2 * self.hb_interval_s:
            raise ValueError("hb_timeout_s must exceed twice hb_interval_s")
        if self.warm_delay_s < 0:
            raise ValueError(f"warm_delay_s must be >= 0, got {self.warm_delay_s}")
        if self.node_devices and set(self.node_devices) != set(range(self.nnodes)):
            raise ValueError(
                f"node_devices names nodes {sorted(self.node_devices)}, the job has 0..{self.nnodes - 1}"
            )


def parse_node_devices(text: str) -> dict[int, str]:
    """'0=0,1;1=2,3' -> {0: '0,1', 1: '2,3'} (the --node-devices value the local launcher writes)."""
    out: dict[int, str] = {}
    for item in filter(None, text.split(";")):
        node, sep, devices = item.partition("=")
        if not sep or not node.strip().isdigit() or not devices.strip():
            raise ValueError(f"--node-devices: {item!r} is not NODE_RANK=DEVICE[,DEVICE...]")
        if int(node) in out:
            raise ValueError(f"--node-devices: node rank {int(node)} given twice")
        out[int(node)] = devices.strip()
    return out
