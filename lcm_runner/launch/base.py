"""The launcher interface the stages drive: submit a job, follow it, break it the way an operator or
a failing machine would, and check what it leaves behind.

Two implementations: `slurm.SlurmLauncher` (sbatch/squeue/scancel/scontrol/srun --overlap, run on the
controller) and `torchrun.LocalLauncher` (N "nodes" as N agent process trees on this machine).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from lcm_runner.contracts import (
    AGENTS,
    DEFAULT_HB_TIMEOUT_S,
    DEFAULT_JOIN_TIMEOUT_S,
    DEFAULT_MASTER_PORT,
    DEFAULT_MAX_RESTARTS,
    DEFAULT_TIME_LIMIT,
)


class LaunchError(RuntimeError):
    """A job could not be submitted, found or acted on."""


class JobState(StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def finished(self) -> bool:
        return self in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED)


@dataclass
class JobSpec:
    """One launch of the trainer on `nodes` nodes: what the stages ask a launcher for.

    Built from the run config in one place, `lcm_runner.launch.jobspec.job_spec`; the launchers (and the
    rendered sbatch) read everything about the launch from here, never from the run config again."""

    name: str  # a label: baseline, resume-1, fault-floor...
    run_dir: Path
    train_args: list[str]
    nodes: int
    procs_per_node: int
    gpus_per_node: int = 0
    agent: str = "lcm"  # lcm (our zygote agent, lcm_runner.launch.agent) | torchrun (stock)
    max_restarts: int = DEFAULT_MAX_RESTARTS
    join_timeout_s: float = DEFAULT_JOIN_TIMEOUT_S
    hb_timeout_s: float = DEFAULT_HB_TIMEOUT_S
    master_port: int = DEFAULT_MASTER_PORT
    env: dict[str, str] = field(default_factory=dict)
    env_file: Path | None = None  # a rendered nccl_env.sh, sourced before the agent starts
    python: str = sys.executable
    time_limit: str = DEFAULT_TIME_LIMIT
    partition: str | None = None  # Slurm: None = the cluster spec's default partition
    container_image: str | None = None  # Slurm + Pyxis: srun --container-image
    container_mounts: list[str] = field(default_factory=list)  # extra --container-mounts
    standby_nodes: int = 0  # hot spare agents (lcm agent): take over a lost node without a relaunch
    warm_ranks: bool = False  # lcm agent: a warm spare per local rank (agent --warm-ranks)
    host_copy: bool = False  # lcm agent: the checkpoint's host copy in shared memory (agent --host-copy)
    module: str = "lcm_runner.train"  # each rank's `python -m` module (the trainer, or a workload's bridge)
    preload: list[str] = field(default_factory=list)  # the zygote's imports (empty: its default for module)

    def validate(self) -> None:
        if self.agent not in AGENTS:
            raise LaunchError(f"agent {self.agent!r} is not one of {', '.join(AGENTS)}")
        if self.nodes < 1 or self.procs_per_node < 1:
            raise LaunchError(f"{self.name}: nodes and procs_per_node must be >= 1")
        if self.gpus_per_node and self.procs_per_node > self.gpus_per_node:
            raise LaunchError(
                f"{self.name}: {self.procs_per_node} procs per node but {self.gpus_per_node} GPUs"
            )
        if self.env_file is not None and not self.env_file.is_file():
            raise LaunchError(f"{self.name}: env file {self.env_file} does not exist")

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node


@dataclass
class Job:
    id: str  # the scheduler's job id (Slurm) or <name>-<n> (local); the trainer's telemetry `job`
    spec: JobSpec
    submitted: float  # unix time of the submission
    tag: str  # LCM_RUN_TAG of every process of this job
    nodes: list[str] = field(default_factory=list)  # filled once placed
    touched: list[str] = field(default_factory=list)  # every node it ever ran on (standby, lost, replaced)

    def all_nodes(self) -> list[str]:
        """The nodes to check for leftovers: current, lost, replaced and standby ones."""
        return list(dict.fromkeys([*self.nodes, *self.touched]))

    @property
    def log_dir(self) -> Path:
        return self.spec.run_dir / "logs" / self.id

    @property
    def events_dir(self) -> Path:
        return self.spec.run_dir / "agents" / self.id


@dataclass
class HardKill:
    """What `Launcher.kill_job` did: SIGKILL (never SIGTERM first) to every process of the job on every
    node at once, agents and ranks, so no rank can catch a signal and checkpoint on the way out."""

    ts: float  # when the SIGKILLs were sent (unix)
    signal: str = "SIGKILL"
    killed: dict[str, list[str]] = field(default_factory=dict)  # node -> "pid comm" of each process killed
    ranks: dict[str, int] = field(default_factory=dict)  # node -> training ranks among them
    left: dict[str, list[str]] = field(default_factory=dict)  # node -> still alive afterwards (none expected)
    agent_exit: dict[str, int] = field(default_factory=dict)  # node -> agent exit status (local: -9)
    job_ended: bool = False  # the job was gone once the kill returned
    note: str = ""

    @property
    def ranks_killed(self) -> int:
        return sum(self.ranks.values())

    def describe(self) -> str:
        where = ", ".join(f"{n}: {self.ranks.get(n, 0)} rank(s)" for n in sorted(self.killed)) or "nothing"
        return f"{self.signal} of every process of the job at once ({where})"


def count_ranks(found: list[Any]) -> int:
    """Training ranks among `procs.Proc`-like entries: trainers whose parent is not a trainer (a rank's
    forked checkpoint writers inherit its name)."""
    trainers = {p.pid for p in found if p.is_trainer}
    return sum(1 for p in found if p.is_trainer and p.ppid not in trainers)


@dataclass
class JobStatus:
    state: JobState
    exit_codes: dict[str, int] = field(default_factory=dict)  # per node (agent exit), when known
    reason: str = ""


class Launcher(Protocol):
    name: str

    def submit(self, spec: JobSpec) -> Job: ...

    def status(self, job: Job) -> JobStatus: ...

    def wait(self, job: Job, timeout_s: float) -> JobStatus: ...

    def cancel(self, job: Job, hard: bool = False) -> None:
        """scancel (SIGTERM to the agents: the ranks may checkpoint on the way out) and wait until the job
        is gone; hard: `kill_job` (SIGKILL of every rank, nothing saved)."""

    def kill_job(self, job: Job) -> HardKill:
        """A crash of the whole job: kill -9 every agent and rank of it on every node at once, from the
        nodes (no scheduler signal sequence: Slurm's cancel sends SIGTERM first, KillWait before SIGKILL),
        then make sure the job has ended."""

    def kill_trainer(self, job: Job, node: str) -> float:
        """kill -9 the training ranks on one node, from that node; returns the kill time (unix)."""

    def kill_node(self, job: Job, node: str) -> float:
        """Lose a node: kill -9 its agent and its ranks together; returns the kill time."""

    def processes_left(self, job: Job, node: str) -> list[str]:
        """Processes of this job still alive on a node (pid + command), empty when clean."""

    def cleanup(self, job: Job) -> None:
        """Kill anything of the job left on any node (after `processes_left` was recorded)."""

    def relaunch(self, job: Job, exclude: list[str]) -> Job:
        """Start the job again from its last checkpoint, away from `exclude` when a spare exists."""

    def close(self) -> None:
        """Stop whatever this launcher started that still runs (on exit or interrupt)."""


def base_env(job_id: str, tag: str, node: str, run_dir: Path) -> dict[str, str]:
    """What every agent of a job gets on top of the launching environment."""
    return {
        "LCM_RUN_TAG": tag,
        "LCM_NODE": node,
        "LCM_RUN_ID": job_id,
        "LCM_RUN_DIR": str(run_dir),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        "PYTHONUNBUFFERED": "1",
        # torchrun shares its rendezvous TCPStore with the workers by default; with gloo a restarted
        # group then reads the previous attempt's addresses (pytorch #135712): never share it.
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
    }
