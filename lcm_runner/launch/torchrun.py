"""Local launcher: N "nodes" on this machine, each one agent process tree in its own session.

Used on a single GPU box (the H200 machine: no Slurm there) and in CI on CPU. A node here is a label
(`local0`, `local1`, ...) carried in the environment of its agent and ranks (LCM_NODE), its own
session/process group so it can be killed alone, and, with GPUs, its own CUDA_VISIBLE_DEVICES slice.
The rendezvous runs on 127.0.0.1. `spare_nodes` extra labels are kept for `relaunch` after a node loss
(a replacement "node" that owns the lost node's GPUs).

Over ~300 lines: the whole torchrun launcher (agents over ssh, follow, kill, node-loss relaunch) is one
Launcher implementation; its node actions already live in procs.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from lcm_runner.launch import procs
from lcm_runner.launch.base import (
    HardKill,
    Job,
    JobSpec,
    JobState,
    JobStatus,
    LaunchError,
    base_env,
    count_ranks,
)
from lcm_runner.launch.commands import agent_argv, shell_join

_PORT_STRIDE = 16  # each submission gets its own ports: master_port + k*stride (+1+gen for the ranks)


@dataclass
class _Local:
    agents: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    cancelled: bool = False
    standby: list[str] = field(default_factory=list)  # nodes running a hot spare agent
    lost: set[str] = field(default_factory=set)  # nodes lost on purpose (kill_node): their code is moot


class LocalLauncher:
    name = "torchrun"

    def __init__(self, spare_nodes: int = 1, node_prefix: str = "local") -> None:
        self.spare_nodes = spare_nodes
        self.node_prefix = node_prefix
        self._jobs: dict[str, _Local] = {}
        self._placed: dict[str, tuple[str, list[str]]] = {}  # job id -> (tag, nodes)
        self._seq = itertools.count(1)

    # --- placement -------------------------------------------------------------------------------
    def pool(self, spec: JobSpec) -> list[str]:
        return [f"{self.node_prefix}{i}" for i in range(spec.nodes + self.spare_nodes)]

    def devices(self, spec: JobSpec, slots: int) -> list[str]:
        """The device slice of each of `slots` emulated nodes ("0,1", "2,3", ...): indices into this
        machine's visible GPUs (CUDA_VISIBLE_DEVICES when set, else every GPU the driver lists)."""
        visible = visible_gpus()
        need = slots * spec.gpus_per_node
        if visible is not None and len(visible) < need:
            raise LaunchError(
                f"{spec.name}: {slots} local node(s) x {spec.gpus_per_node} GPUs need {need} GPUs, "
                f"{len(visible)} visible ({','.join(visible) or 'none'})"
            )
        ids = visible if visible is not None else [str(g) for g in range(need)]
        return [",".join(ids[k * spec.gpus_per_node : (k + 1) * spec.gpus_per_node]) for k in range(slots)]

    def plan_devices(
        self, spec: JobSpec, nodes: int, standby: int
    ) -> tuple[list[str | None], list[str | None], str]:
        """CUDA_VISIBLE_DEVICES of the job's node ranks, of its standby agents, and the per-node device
        map handed to the standby agents ("" when none is needed).

        Node rank k gets slice k (a relaunch on a spare label takes the slot it fills). A standby gets a
        slice of its own when the machine has free GPUs for it (as a real spare node has); otherwise it
        gets none and, on takeover of node k, runs its ranks on node k's slice: the nodes are emulated
        on one machine and the lost node's GPUs are free once its processes are dead (kill_node waits
        for that)."""
        if not spec.gpus_per_node:
            return [None] * nodes, [None] * standby, ""
        visible = visible_gpus()
        free = 0 if visible is None else len(visible) // spec.gpus_per_node - nodes
        own = min(max(free, 0), standby)
        slices = self.devices(spec, nodes + own)
        spares: list[str | None] = [*slices[nodes:], *([None] * (standby - own))]
        shared = standby > own  # some standby has no GPUs of its own: it takes over the lost node's
        return list(slices[:nodes]), spares, format_node_devices(slices[:nodes]) if shared else ""

    # --- submit ----------------------------------------------------------------------------------
    def submit(self, spec: JobSpec, nodes: list[str] | None = None) -> Job:
        spec.validate()
        n = next(self._seq)
        job_id = f"{spec.name}-{n}"
        while (spec.run_dir / "logs" / job_id).exists():  # ids stay unique in a reused run dir
            n = next(self._seq)
            job_id = f"{spec.name}-{n}"
        placed = nodes if nodes is not None else self.pool(spec)[: spec.nodes]
        if len(placed) != spec.nodes:
            raise LaunchError(f"{job_id}: needs {spec.nodes} nodes, {len(placed)} available")
        standby: list[str] = []
        if spec.standby_nodes and spec.agent == "lcm":
            free = [x for x in self.pool(spec) if x not in placed]
            if len(free) < spec.standby_nodes:
                raise LaunchError(f"{job_id}: {spec.standby_nodes} standby node(s) asked, {len(free)} spare")
            standby = free[: spec.standby_nodes]
        node_gpus, standby_gpus, node_devices = self.plan_devices(spec, len(placed), len(standby))
        job = Job(job_id, spec, time.time(), tag=f"{spec.run_dir.name}/{job_id}", nodes=placed)
        job.log_dir.mkdir(parents=True, exist_ok=True)
        job.events_dir.mkdir(parents=True, exist_ok=True)
        port = spec.master_port + _PORT_STRIDE * (n % 64)
        run_spec = dataclasses.replace(spec, master_port=port)
        local = _Local()
        local.standby = standby
        job.touched = placed + standby
        gpus_of = dict(zip(placed + standby, node_gpus + standby_gpus, strict=True))
        for rank, node in enumerate(placed + standby):
            argv = agent_argv(
                run_spec,
                node_rank=str(rank),
                master_addr="127.0.0.1",
                events=str(job.events_dir / f"{node}.jsonl"),
                log_dir=str(job.log_dir),
                rdzv_id=job_id,
                standby=node in standby,
                node_devices=node_devices if node in standby else "",
            )
            env = {**os.environ, **spec.env, **base_env(job_id, job.tag, node, spec.run_dir)}
            gpus = gpus_of.get(node)
            if gpus is not None:
                env["CUDA_VISIBLE_DEVICES"] = gpus
            if spec.env_file is not None:
                # the job's own variables (e.g. NCCL_DEBUG=INFO for profiling) win over the file's
                src = shlex.quote(str(spec.env_file))
                again = "".join(f"export {k}={shlex.quote(v)}; " for k, v in spec.env.items())
                cmd = ["bash", "-c", f"set -a; . {src}; set +a; {again}exec {shell_join(argv)}"]
            else:
                cmd = argv
            log = (job.log_dir / f"{node}.agent.log").open("ab")
            local.agents[node] = subprocess.Popen(
                cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
            log.close()
        self._jobs[job_id] = local
        self._placed[job_id] = (job.tag, placed + standby)
        return job

    def _local(self, job: Job) -> _Local:
        try:
            return self._jobs[job.id]
        except KeyError:
            raise LaunchError(f"job {job.id} was not started by this launcher") from None

    # --- follow ----------------------------------------------------------------------------------
    def status(self, job: Job) -> JobStatus:
        local = self._local(job)
        codes = {node: p.poll() for node, p in local.agents.items()}
        done = {node: c for node, c in codes.items() if c is not None}
        if len(done) < len(codes):
            return JobStatus(JobState.RUNNING, done)
        if local.cancelled:
            return JobStatus(JobState.CANCELLED, done, "cancelled")
        if all(c == 0 for n, c in done.items() if n not in local.lost):
            return JobStatus(JobState.COMPLETED, done)
        return JobStatus(JobState.FAILED, done, ", ".join(f"{n}={c}" for n, c in done.items() if c))

    def wait(self, job: Job, timeout_s: float) -> JobStatus:
        deadline = time.monotonic() + timeout_s
        st = self.status(job)
        while not st.state.finished and time.monotonic() < deadline:
            time.sleep(0.05)
            st = self.status(job)
        return st

    def cancel(self, job: Job, hard: bool = False) -> None:
        """As scancel: SIGTERM every agent, SIGKILL what is left after 10 s; hard: `kill_job`."""
        if hard:
            self.kill_job(job)
            return
        local = self._local(job)
        local.cancelled = True
        for p in local.agents.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        st = self.wait(job, 10.0)
        if not st.state.finished:
            for p in local.agents.values():
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
            self.wait(job, 5.0)
        # as a scheduler ends a cancelled job's steps: nothing of it stays on its nodes
        self.cleanup(job)

    def kill_job(self, job: Job) -> HardKill:
        """SIGKILL every agent and every rank of the job on every node in one pass (ranks run in their
        own process groups, stock torchrun's in their own sessions: the agents' groups alone would miss
        them), again for anything started meanwhile, until nothing of the job is left. Every process is
        SIGSTOPped before the first SIGKILL (`procs.freeze_then_kill`, as SlurmLauncher.kill_job does
        across nodes): no rank sees its agent or a peer die first and exits or is reaped uncounted."""
        local = self._local(job)
        local.cancelled = True
        nodes = job.all_nodes()
        found = procs.union([p for node in nodes for p in procs.scan(job.tag, node)])
        ts = time.time()
        groups = tuple(p.pid for p in local.agents.values() if p.poll() is None)
        # every process of every node frozen, then killed: none sees another die first
        dead = procs.freeze_then_kill(found, groups)
        killed: dict[str, list[procs.Proc]] = {n: [p for p in dead if p.node == n] for n in nodes}
        # ranks as they stood at the kill (a re-scan sees orphans re-parented away from their rank)
        ranks = {n: count_ranks(ps) for n, ps in killed.items() if ps}
        deadline = time.monotonic() + 10.0
        left = {node: procs.scan(job.tag, node) for node in nodes}
        while any(left.values()) and time.monotonic() < deadline:
            for node, rest in left.items():  # forked after the scan (a checkpoint writer, a restart)
                gone = set(procs.kill(rest))
                killed[node] += [p for p in rest if p.pid in gone and p not in killed[node]]
            time.sleep(0.05)
            left = {node: procs.scan(job.tag, node) for node in nodes}
        st = self.wait(job, 5.0)
        return HardKill(
            ts,
            killed={n: [f"{p.pid} {p.comm}" for p in ps] for n, ps in killed.items() if ps},
            ranks=ranks,
            left={n: [f"{p.pid} {p.comm}" for p in ps] for n, ps in left.items() if ps},
            agent_exit={n: c for n, c in st.exit_codes.items()},
            job_ended=st.state.finished,
        )

    # --- faults ----------------------------------------------------------------------------------
    def kill_trainer(self, job: Job, node: str) -> float:
        self._check_node(job, node)
        trainers = [p for p in procs.scan(job.tag, node) if p.is_trainer]
        if not trainers:
            raise LaunchError(f"{job.id}: no trainer process on {node} to kill")
        ts = time.time()
        procs.kill(trainers)
        return ts

    def kill_node(self, job: Job, node: str) -> float:
        self._check_node(job, node)
        victims = procs.scan(job.tag, node)
        if not victims:
            raise LaunchError(f"{job.id}: nothing of the job runs on {node}")
        ts = time.time()
        self._local(job).lost.add(node)
        agent = self._local(job).agents[node]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(agent.pid, signal.SIGKILL)  # the agent's session at once
        procs.kill(victims)  # ranks in their own process groups
        procs.wait_gone(job.tag, node, 5.0)
        return ts

    def processes_left(self, job: Job, node: str) -> list[str]:
        return [f"{p.pid} {p.comm}: {p.cmdline[:120]}" for p in procs.scan(job.tag, node)]

    def cleanup(self, job: Job) -> None:
        for node in job.all_nodes():
            procs.kill(procs.scan(job.tag, node))
            procs.wait_gone(job.tag, node, 5.0)

    def relaunch(self, job: Job, exclude: list[str]) -> Job:
        """Start the job again (the trainer auto-resumes from --load's latest) on nodes not excluded,
        once the old one has ended (its survivors give up within their bounded timeouts; past that
        bound the old job is killed, as a scheduler's time limit would)."""
        bound = job.spec.join_timeout_s + job.spec.hb_timeout_s + 30.0
        local = self._local(job)
        if local.standby:
            # a hot spare takes the lost node's rank inside the same job: wait for its takeover
            deadline = time.monotonic() + bound
            while time.monotonic() < deadline:
                took = self._takeovers(job)
                if took:
                    for spare in took:
                        local.standby.remove(spare)
                    job.nodes = [n for n in job.nodes if n not in exclude] + took
                    return job
                if self.status(job).state.finished:
                    break  # no takeover happened: fall back to a relaunch
                time.sleep(0.05)
        if not self.wait(job, bound).state.finished:
            self.cancel(job, hard=True)
        keep = [n for n in job.nodes if n not in exclude]
        spares = [n for n in self.pool(job.spec) if n not in job.nodes and n not in exclude]
        # the lost node "comes back" when no spare is left
        fill = spares + [n for n in exclude if n in job.nodes]
        nodes = keep + fill[: job.spec.nodes - len(keep)]
        return self.submit(job.spec, nodes=nodes)

    def _takeovers(self, job: Job) -> list[str]:
        """Standby nodes of the job whose agent took over a lost node (its `takeover` event)."""
        took = []
        for node in self._local(job).standby:
            path = job.events_dir / f"{node}.jsonl"
            if path.is_file() and '"event": "takeover"' in path.read_text(encoding="utf-8", errors="replace"):
                took.append(node)
        return took

    def close(self) -> None:
        """Kill every job this launcher started that still runs (the CLI exits or is interrupted)."""
        for local in self._jobs.values():
            for p in local.agents.values():
                if p.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(p.pid, signal.SIGKILL)
        for tag, nodes in self._placed.values():
            for node in nodes:
                procs.kill(procs.scan(tag, node))

    def _check_node(self, job: Job, node: str) -> None:
        if node not in job.nodes:
            raise LaunchError(f"{job.id}: {node} is not one of its nodes {job.nodes}")


def visible_gpus() -> list[str] | None:
    """This machine's GPUs as CUDA_VISIBLE_DEVICES entries, without initialising CUDA: the launcher's
    own CUDA_VISIBLE_DEVICES when set, else as many as both the driver lists (/proc/driver/nvidia/gpus)
    and this process can open (/dev/nvidiaN: a container may see the host's list but only its own
    devices); None when unknown."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip()]
    proc = Path("/proc/driver/nvidia/gpus")
    if not proc.is_dir():
        return None
    listed = len(list(proc.iterdir()))
    nodes = len([d for d in Path("/dev").glob("nvidia[0-9]*") if d.name.removeprefix("nvidia").isdigit()])
    return [str(i) for i in range(min(listed, nodes))]


def format_node_devices(slices: list[str]) -> str:
    """The agent's --node-devices value: node rank k -> slice k, e.g. "0=0,1;1=2,3"."""
    return ";".join(f"{k}={d}" for k, d in enumerate(slices))


def describe(job: Job) -> str:
    return f"{job.id} on {','.join(job.nodes)} (logs {Path(job.log_dir)})"
