"""The per-node agent command line, one builder for both launchers (local and Slurm).

`node_rank` and `master_addr` are strings so the Slurm launcher can pass shell expressions
(`$SLURM_NODEID`, `$MASTER_ADDR`) that the batch script expands on each node.
"""

from __future__ import annotations

import shlex

from lcm_runner.launch.base import JobSpec
from lcm_runner.launch.procs import TRAINER_MODULE


def agent_argv(
    spec: JobSpec,
    node_rank: str,
    master_addr: str,
    events: str,
    log_dir: str,
    rdzv_id: str,
    standby: bool = False,
    node_devices: str = "",
) -> list[str]:
    """argv of one node's agent: our `lcm_runner.launch.agent`, or stock torchrun for comparison.

    `node_devices` ("0=0,1;1=2,3", node rank -> CUDA_VISIBLE_DEVICES): only the local launcher passes
    it, to a standby agent that has no GPUs of its own (nodes emulated on one machine); a standby on a
    real spare node keeps its own devices."""
    if spec.agent == "lcm":
        return [
            spec.python,
            "-m",
            "lcm_runner.launch.agent",
            "--nnodes",
            str(spec.nodes),
            *(["--standby"] if standby else ["--node-rank", node_rank]),
            "--nproc-per-node",
            str(spec.procs_per_node),
            "--master-addr",
            master_addr,
            "--master-port",
            str(spec.master_port),
            "--max-restarts",
            str(spec.max_restarts),
            "--join-timeout",
            str(spec.join_timeout_s),
            "--hb-timeout",
            str(spec.hb_timeout_s),
            "--events",
            events,
            "--log-dir",
            log_dir,
            *(["--node-devices", node_devices] if node_devices else []),
            *(["--warm-ranks"] if spec.warm_ranks else []),
            *(["--host-copy"] if spec.host_copy else []),
            *(["--module", spec.module] if spec.module != TRAINER_MODULE else []),
            *(["--preload", ",".join(spec.preload)] if spec.preload else []),
            "--",
            *spec.train_args,
        ]
    return [
        spec.python,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(spec.nodes),
        "--nproc-per-node",
        str(spec.procs_per_node),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"{master_addr}:{spec.master_port}",
        "--rdzv-id",
        rdzv_id,
        "--rdzv-conf",
        f"join_timeout={int(spec.join_timeout_s)}",
        "--max-restarts",
        str(spec.max_restarts),
        "--monitor-interval",
        "0.1",
        "-m",
        spec.module,
        *spec.train_args,
    ]


def shell_join(argv: list[str], raw: tuple[str, ...] = ()) -> str:
    """Quote argv for a shell line, leaving the `raw` items (shell variables) unquoted."""
    return " ".join(a if a in raw else shlex.quote(a) for a in argv)
