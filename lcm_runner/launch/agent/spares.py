"""Warm spare ranks (`--warm-ranks`): one per local rank, forked from the zygote `warm_delay_s` after each
generation starts, warmed (lcm_runner.launch.warm: the CUDA context on the rank's device), then held.
When the generation ends in a restart, Ranks.spawn hands each local rank's environment to its spare
instead of forking a cold process; a spare that died or is missing is replaced by a fork, so a restart
never waits for one. Spares are not ranks: teardown leaves them alone, and they are stopped (their pipe
closed, then SIGKILL) when the agent is done with the job.
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass
from pathlib import Path

from lcm_runner.launch import warm
from lcm_runner.launch.agent.config import AgentConfig
from lcm_runner.launch.agent.events import Events


@dataclass
class Spare:
    local_rank: int
    pid: int
    fd: int  # the write end of its order pipe


class Spares:
    def __init__(self, cfg: AgentConfig, ev: Events, reset: tuple[int, ...]) -> None:
        self.cfg = cfg
        self.ev = ev
        self.reset = reset
        self.pool: dict[int, Spare] = {}
        self.due: float | None = None  # when to fork the missing spares (monotonic)
        self.served = 0  # ranks a spare became

    def fds(self) -> list[int]:
        return [s.fd for s in self.pool.values()]

    def pids(self) -> set[int]:
        return {s.pid for s in self.pool.values()}

    def schedule(self, now: float) -> None:
        """A generation just started: fork the missing spares `warm_delay_s` from now (not at once: the
        new ranks' own start-up comes first)."""
        self.due = now + self.cfg.warm_delay_s

    def tick(self, now: float, reaped: dict[int, int]) -> None:
        if self.due is not None and now >= self.due:
            self.due = None
            self.fill(reaped)

    def _pre_env(self, local: int) -> dict[str, str]:
        env = {"LOCAL_RANK": str(local)}
        devices = self.cfg.node_devices.get(self.cfg.node_rank)
        if devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = devices
        return env

    def fill(self, reaped: dict[int, int]) -> None:
        """Fork a spare for every local rank that has none alive."""
        made = []
        for local in range(self.cfg.nproc_per_node):
            have = self.pool.get(local)
            if have is not None and have.pid not in reaped:
                continue
            if have is not None:
                self._drop(local)
            r, w = os.pipe()
            others = self.fds()
            pid = os.fork()
            if pid == 0:
                os.close(w)
                warm.run_spare(
                    self.cfg.module, self.cfg.train_args, local, self._pre_env(local), r, others, self.reset
                )
            os.close(r)
            with contextlib.suppress(PermissionError, ProcessLookupError):
                os.setpgid(pid, pid)
            self.pool[local] = Spare(local, pid, w)
            made.append(pid)
        if made:
            self.ev.emit("spares", pids=made)

    def take(self, local: int, env: dict[str, str], log: Path | None, reaped: dict[int, int]) -> int | None:
        """Hand local rank `local`'s order to its spare; the pid that becomes the rank, or None (no
        live spare: the caller forks one)."""
        s = self.pool.pop(local, None)
        if s is None:
            return None
        if s.pid in reaped:
            os.close(s.fd)
            return None
        try:
            os.write(s.fd, warm.order_bytes(env, log))
        except OSError:  # it died after the last reap
            with contextlib.suppress(ProcessLookupError):
                os.killpg(s.pid, signal.SIGKILL)
            return None
        finally:
            os.close(s.fd)
        self.served += 1
        return s.pid

    def _drop(self, local: int) -> None:
        s = self.pool.pop(local)
        with contextlib.suppress(OSError):
            os.close(s.fd)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(s.pid, signal.SIGKILL)

    def stop(self) -> None:
        """The job is over (or the agent is leaving): every spare goes; their exits are reaped as any
        child's."""
        self.due = None
        for local in list(self.pool):
            self._drop(local)
