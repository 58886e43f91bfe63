"""Supervision of the node's ranks: fork them from the warm zygote (or exec them), reap them with
waitpid, forward signals to them, and tear them down by process group until nothing tagged for this
node is left."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from lcm_runner.launch import procs, zygote
from lcm_runner.launch.agent.config import AgentConfig
from lcm_runner.launch.agent.events import Events
from lcm_runner.launch.agent.spares import Spares

HOST_COPY_ENV = "LCM_HOST_COPY_DIR"  # lcm_runner.train.ckpt_shm.ENV (the trainer's side of it)

# signals the agent catches and forwards to its ranks (a forked rank resets them to the default)
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)


@dataclass
class Worker:
    rank: int
    local_rank: int
    pid: int
    code: int | None = None


class Ranks:
    def __init__(self, cfg: AgentConfig, ev: Events) -> None:
        self.cfg = cfg  # shared with the agent: node_rank changes when a standby takes over
        self.ev = ev
        self.workers: list[Worker] = []
        self._reaped: dict[int, int] = {}  # pid -> exit code, of every child reaped
        # escape hatch: start ranks as fresh processes instead of forking the warm zygote
        self.exec_ranks = os.environ.get("LCM_AGENT_EXEC", "") == "1"
        # warm spares (spares.py): forked from the zygote, so not with exec'd ranks
        warm = cfg.warm_ranks and not self.exec_ranks
        self.spares = Spares(cfg, ev, (*FORWARDED, signal.SIGCHLD)) if warm else None

    def rank_env(self, local: int, gen: int) -> dict[str, str]:
        """The torchrun environment of local rank `local` of this node in generation `gen`."""
        c = self.cfg
        rank = c.node_rank * c.nproc_per_node + local
        env = {
            "RANK": str(rank),
            "LOCAL_RANK": str(local),
            "GROUP_RANK": str(c.node_rank),
            "NODE_RANK": str(c.node_rank),
            "WORLD_SIZE": str(c.nnodes * c.nproc_per_node),
            "LOCAL_WORLD_SIZE": str(c.nproc_per_node),
            "MASTER_ADDR": c.master_addr,
            "MASTER_PORT": str(c.master_port + 1 + gen),
            "TORCHELASTIC_RESTART_COUNT": str(gen),
            "TORCHELASTIC_MAX_RESTARTS": str(c.max_restarts),
            "LCM_ATTEMPT": str(gen),
        }
        if c.host_copy_dir is not None:
            env[HOST_COPY_ENV] = str(c.host_copy_dir)
        if c.node_rank in c.node_devices:
            # set in the forked rank before the trainer touches CUDA (the zygote never initialises it)
            env["CUDA_VISIBLE_DEVICES"] = c.node_devices[c.node_rank]
        return env

    def _log(self, rank: int) -> Path | None:
        return self.cfg.log_dir / f"rank{rank}.log" if self.cfg.log_dir is not None else None

    def _child(self, w: Worker, env: dict[str, str]) -> NoReturn:
        log = self._log(w.rank)
        if self.spares is not None:  # the spares' pipes: theirs must see EOF when the agent closes them
            for fd in self.spares.fds():
                with contextlib.suppress(OSError):
                    os.close(fd)
        zygote.run_rank(self.cfg.module, self.cfg.train_args, env, log, reset=(*FORWARDED, signal.SIGCHLD))

    def spawn(self, gen: int) -> None:
        c = self.cfg
        self.workers = []
        warmed: list[int] = []
        for local in range(c.nproc_per_node):
            env = self.rank_env(local, gen)
            rank = int(env["RANK"])
            if self.exec_ranks:
                proc = zygote.exec_rank(sys.executable, c.module, c.train_args, env, self._log(rank))
                self.workers.append(Worker(rank, local, proc.pid))
                continue
            if self.spares is not None:
                pid = self.spares.take(local, env, self._log(rank), self._reaped)
                if pid is not None:
                    self.workers.append(Worker(rank, local, pid))
                    warmed.append(local)
                    continue
            pid = os.fork()
            w = Worker(rank, local, pid)
            if pid == 0:
                self._child(w, env)
            # the child does it too; whichever runs first wins, the other finds it done
            with contextlib.suppress(PermissionError, ProcessLookupError):
                os.setpgid(pid, pid)
            self.workers.append(w)
        if self.spares is not None:
            self.spares.schedule(time.monotonic())
            self.ev.emit("spawn", gen=gen, pids=[w.pid for w in self.workers], warm=warmed)
        else:
            self.ev.emit("spawn", gen=gen, pids=[w.pid for w in self.workers])

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self._reaped[pid] = os.waitstatus_to_exitcode(status)

    def newly_exited(self) -> Iterator[Worker]:
        """The workers reaped since they were last looked at, in rank order, each with its code set
        (lazily: a caller that stops at one leaves the next for its next poll)."""
        for w in self.workers:
            if w.code is None and w.pid in self._reaped:
                w.code = self._reaped[w.pid]
                yield w

    def all_exited(self) -> bool:
        return all(w.code is not None for w in self.workers)

    def codes(self) -> set[int]:
        """The exit codes of the ranks that have exited (all of them once `all_exited`)."""
        return {w.code for w in self.workers if w.code is not None}

    def forward(self, sig: int) -> None:
        for w in self.workers:
            if w.code is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(w.pid, sig)

    def teardown(self, gen: int, why: str) -> None:
        t0 = time.monotonic()
        for w in self.workers:
            if w.code is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(w.pid, signal.SIGKILL)
        # everything started for this node except this agent: helpers in other groups, orphans; not the
        # node's metrics writer, which the node task started beside this agent and stops after it (killed
        # here, its last file, the one with the job's final steps, would never be written)
        tag = os.environ.get(procs.TAG_ENV)
        left: list[procs.Proc] = []
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            self.reap()
            alive = [w for w in self.workers if w.code is None and w.pid not in self._reaped]
            left = procs.agents_own(tag, os.environ.get(procs.NODE_ENV)) if tag else []
            left = [p for p in left if p.pid not in self._spare_pids()]  # spares are not ranks
            if tag:
                procs.kill(left)
            if not alive and not left:
                break
            time.sleep(0.01)
        for w in self.workers:
            if w.code is None:
                w.code = self._reaped.get(w.pid)
        self.ev.emit(
            "teardown", gen=gen, why=why, s=round(time.monotonic() - t0, 4), left=[p.pid for p in left]
        )

    def _spare_pids(self) -> set[int]:
        return self.spares.pids() if self.spares is not None else set()

    def tick(self, now: float) -> None:
        """The monitor's poll: fork the warm spares once they are due."""
        if self.spares is not None:
            self.spares.tick(now, self._reaped)

    def stop_spares(self) -> None:
        if self.spares is not None:
            self.spares.stop()

    def clear_leftovers(self, gen: int) -> None:
        """After a clean finish: the ranks' helpers get a moment to exit on their own; whatever stays
        is killed and recorded (the warm spares are stopped first: they are not leftovers)."""
        self.stop_spares()
        tag = os.environ.get(procs.TAG_ENV)
        if tag:
            left = procs.wait_gone(tag, os.environ.get(procs.NODE_ENV), 2.0, agents_only=True)
            if left:
                self.ev.emit("leftovers", gen=gen, procs=[f"{p.pid} {p.cmdline[:80]}" for p in left])
                self.teardown(gen, "leftovers after a clean finish")
