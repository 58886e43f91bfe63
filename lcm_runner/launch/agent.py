"""lcm-agent: one per node. A pre-imported zygote that forks the node's training ranks and restarts
them in place when any rank on any node fails.

Why not stock torchrun: its restart re-execs every worker, so each recovery pays interpreter start and
the torch + megatron imports again (seconds on a busy CPU), and its monitor waits for the whole worker
group before the rendezvous round. This agent

- imports torch, torch.distributed and the trainer's modules ONCE, before any thread or CUDA context
  exists, then ``fork()``s the ranks from that warm image (a zygote, as Android's app launcher does);
- watches its ranks with ``waitpid`` every 20 ms and publishes a failure at once in a small TCPStore
  (hosted by the node-0 agent) that every agent polls, so a kill on one node is seen by the others
  in tens of milliseconds without waiting for a collective to time out;
- tears the ranks down by process group (``killpg`` SIGKILL: the rank and the multiprocessing helpers
  it started), as a child subreaper so nothing is re-parented away, and checks that nothing tagged for
  this node is left before it forks the next generation;
- gives every generation a fresh rendezvous port for the ranks' own store (the stale-peer bug of
  torchrun's shared TCPStore with gloo cannot happen);
- heartbeats through the store: a node whose agent stops (node loss) is declared lost after
  ``hb_timeout_s`` and every survivor tears down and exits ``NODE_LOST`` (76) within that bound, so
  the scheduler (Slurm requeue / the local launcher) relaunches from the last checkpoint instead of
  a survivor waiting for the default rendezvous/NCCL timeouts.

The trainer runs unchanged: the rank executes ``python -m <module> <args>`` semantics through
``runpy`` with the usual torchrun environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT,
TORCHELASTIC_RESTART_COUNT = generation). Events go to ``--events`` (JSON lines) for the stages.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn

from lcm_runner.contracts import (
    DEFAULT_HB_INTERVAL_S,
    DEFAULT_HB_TIMEOUT_S,
    DEFAULT_JOIN_TIMEOUT_S,
    DEFAULT_MAX_RESTARTS,
    FATAL_EXIT_CODES,
    AgentExit,
    ExitCode,
)
from lcm_runner.launch import nodefail, procs, zygote

_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)


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
    module: str = "lcm_runner.train"
    preload: list[str] = field(default_factory=list)
    events: Path | None = None
    log_dir: Path | None = None
    train_args: list[str] = field(default_factory=list)
    standby: bool = False  # a hot spare: preload, wait, take over a lost node's rank
    # node rank -> CUDA_VISIBLE_DEVICES of its ranks (local launcher: nodes emulated on one machine, a
    # standby without GPUs of its own runs the node it takes over on that node's devices). Empty: the
    # ranks inherit the agent's CUDA_VISIBLE_DEVICES (a real node, or a spare with its own GPUs).
    node_devices: dict[int, str] = field(default_factory=dict)

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


class _Events:
    def __init__(self, path: Path | None, node_rank: int) -> None:
        self._node = node_rank
        self._fh = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = path.open("a", buffering=1)

    def emit(self, event: str, **data: Any) -> None:
        rec = {"ts": time.time(), "event": event, "node_rank": self._node, "pid": os.getpid(), **data}
        line = json.dumps(rec)
        if self._fh is not None:
            self._fh.write(line + "\n")
        print(f"[lcm-agent node{self._node}] {line}", file=sys.stderr, flush=True)


@dataclass
class _Worker:
    rank: int
    local_rank: int
    pid: int
    code: int | None = None


class Agent:
    def __init__(self, cfg: AgentConfig) -> None:
        cfg.validate()
        self.cfg = cfg
        self.ev = _Events(cfg.events, cfg.node_rank)
        self.store: Any = None
        self.gen = 0
        self.workers: list[_Worker] = []
        self.pending_signal: int | None = None
        self.forwarded = False
        self.fatal_code = 0  # the trainer exit code that ended the job for good (FATAL_EXIT_CODES)
        self._reaped: dict[int, int] = {}
        self._hb_next = 0.0
        self._hb_last = 0.0
        self._peer_seen: dict[int, tuple[int, float]] = {}
        self._lost_peer: int | None = None
        # escape hatch: start ranks as fresh processes instead of forking the warm zygote
        self.exec_ranks = os.environ.get("LCM_AGENT_EXEC", "") == "1"
        self._awaiting: set[int] = set()  # lost peers a standby was asked to replace
        self._deadman: nodefail.Deadman | None = None  # bounds a store call that hangs (partition)

    # --- store -----------------------------------------------------------------------------------
    def connect(self) -> None:
        import torch.distributed as dist

        c = self.cfg
        self.store = dist.TCPStore(
            c.master_addr,
            c.master_port,
            None,
            c.node_rank == 0 and not c.standby,
            timedelta(seconds=c.join_timeout_s),
            wait_for_workers=False,
        )
        self.store.set_timeout(timedelta(seconds=c.hb_timeout_s))

    def _heartbeat(self) -> str | None:
        """Beat, and return the first peer whose beat stopped (None when all are alive)."""
        now = time.monotonic()
        if now < self._hb_next:
            return None
        self._hb_next = now + self.cfg.hb_interval_s
        # An agent that was itself descheduled (a busy node) cannot judge its peers' silence: it restarts
        # their clocks instead of declaring a loss it could not have observed.
        starved = self._hb_last > 0 and now - self._hb_last > self.cfg.hb_timeout_s / 2
        self._hb_last = now
        self.store.add(f"hb/{self.cfg.node_rank}", 1)
        for peer in range(self.cfg.nnodes):
            if peer == self.cfg.node_rank or peer in self._awaiting:
                continue
            if self.store.check([f"done/{self.gen}/{peer}"]):
                continue
            count = self.store.add(f"hb/{peer}", 0)
            last = self._peer_seen.get(peer)
            if last is None or last[0] != count or starved:
                self._peer_seen[peer] = (count, now)
            elif now - last[1] > self.cfg.hb_timeout_s:
                self._lost_peer = peer
                return f"node{peer} heartbeat stopped {now - last[1]:.1f}s ago"
        return None

    # --- hot spares --------------------------------------------------------------------------------
    def _request_takeover(self, peer: int, gen: int) -> bool:
        """Ask a standby agent to take `peer`'s node rank at generation `gen`; False when none is free.
        Several survivors may ask: the first one posts the request, the others find it posted."""
        if peer == 0:
            return False  # node 0 hosts the store: losing it ends the job for everyone
        free = self.store.add("standby/count", 0) - self.store.add("standby/claimed", 0)
        key = f"takeover_by/{gen}/{peer}"
        mine = str(self.cfg.node_rank)
        if self.store.check([key]):
            return True
        if free <= 0:
            return False
        if self.store.compare_set(key, "", mine).decode() == mine:
            n = self.store.add("takeover/seq", 1)
            self.store.set(f"takeover/{n}", json.dumps({"gen": gen, "node_rank": peer}))
            self.ev.emit("takeover_requested", gen=gen, node=peer)
        self._awaiting.add(peer)
        self._peer_seen.pop(peer, None)
        return True

    def standby(self) -> int:
        """Wait, warm, for a takeover request; then become the lost node and run its ranks."""
        me = f"{os.uname().nodename}:{os.getpid()}"
        seen = self._announce(me)
        while True:
            if self.pending_signal is not None:
                return 128 + self.pending_signal
            if self.store.check(["finished"]):
                self.ev.emit("exit", code=0, reason="standby not needed: the job finished")
                return 0
            seen, claimed = self._claim_takeover(seen, me)
            if claimed:
                return self._loop()
            time.sleep(self.cfg.store_poll_s)

    def _announce(self, me: str) -> int:
        """Count this standby as free; returns the last takeover request it need not look at."""
        seen = self.store.add("takeover/seq", 0)  # before announcing: no request can fall in between
        self.store.add("standby/count", 1)
        self.ev.emit("standby", id=me)
        return seen

    def _claim_takeover(self, seen: int, me: str) -> tuple[int, bool]:
        """Look at the takeover requests after `seen`; claim the first one still free (compare-and-set)
        and become that node. Returns (last request seen, claimed)."""
        latest = self.store.add("takeover/seq", 0)
        while seen < latest:
            seen += 1
            req = json.loads(self.store.get(f"takeover/{seen}"))
            if self.store.compare_set(f"claim/{seen}", "", me).decode() == me:
                self.store.add("standby/claimed", 1)
                self.cfg.node_rank = int(req["node_rank"])
                self.cfg.standby = False
                self.gen = int(req["gen"])
                self.ev._node = self.cfg.node_rank
                devices = self.cfg.node_devices.get(self.cfg.node_rank)
                self.ev.emit("takeover", gen=self.gen, node=self.cfg.node_rank, id=me, devices=devices)
                return seen, True
        return seen, False

    def rendezvous(self) -> str | None:
        """All agents join generation ``gen``; returns a reason when that fails within join_timeout_s."""
        with self._store_bounded():
            return self._rendezvous()

    @contextlib.contextmanager
    def _store_bounded(self) -> Any:
        """While the loop inside polls the store: a store call that hangs (this node cut off) ends
        the agent with NODE_LOST after 2 x hb_timeout_s (nodefail.Deadman)."""
        if self._deadman is not None:
            self._deadman.arm()
        try:
            yield
        finally:
            if self._deadman is not None:
                self._deadman.arm(False)

    def _beat(self) -> None:
        if self._deadman is not None:
            self._deadman.beat()

    def _store_hung(self, silent_s: float) -> None:
        """Deadman thread: the main thread is stuck in a store call; stop the ranks and exit 76."""
        self.ev.emit("store_error", gen=self.gen, error=f"store call blocked {silent_s:.1f}s (cut off?)")
        self.teardown("store call blocked")
        if self.cfg.node_rank != 0:
            self._mark_lost(0, f"store on node0 silent {silent_s:.1f}s")
        self.ev.emit("exit", code=int(AgentExit.NODE_LOST), reason=f"store call blocked {silent_s:.1f}s")
        os._exit(int(AgentExit.NODE_LOST))

    def _rendezvous(self) -> str | None:
        t0 = time.monotonic()
        key = f"join/{self.gen}"
        self.store.add(key, 1)
        deadline = t0 + self.cfg.join_timeout_s
        while True:
            self._beat()
            joined = self.store.add(key, 0)
            if joined >= self.cfg.nnodes:
                break
            if self.store.check([f"lost/{self.gen}"]):
                return self.store.get(f"lost/{self.gen}").decode()
            if time.monotonic() > deadline:
                return (
                    f"only {joined}/{self.cfg.nnodes} nodes joined generation {self.gen} "
                    f"within {self.cfg.join_timeout_s}s"
                )
            lost = self._heartbeat()
            if lost and self.gen > 0:
                if self._lost_peer is not None and self._request_takeover(self._lost_peer, self.gen):
                    deadline = max(deadline, time.monotonic() + self.cfg.join_timeout_s)
                    continue
                return lost
            time.sleep(self.cfg.poll_s)
        self._peer_seen.clear()
        self._awaiting.clear()
        self.ev.emit("rendezvous", gen=self.gen, wait_s=round(time.monotonic() - t0, 4))
        return None

    # --- ranks -----------------------------------------------------------------------------------
    def _child(self, w: _Worker, env: dict[str, str]) -> NoReturn:
        log = self.cfg.log_dir / f"rank{w.rank}.log" if self.cfg.log_dir is not None else None
        zygote.run_rank(self.cfg.module, self.cfg.train_args, env, log, reset=(*_FORWARDED, signal.SIGCHLD))

    def rank_env(self, local: int) -> dict[str, str]:
        """The torchrun environment of local rank `local` of this node in the current generation."""
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
            "MASTER_PORT": str(c.master_port + 1 + self.gen),
            "TORCHELASTIC_RESTART_COUNT": str(self.gen),
            "TORCHELASTIC_MAX_RESTARTS": str(c.max_restarts),
            "LCM_ATTEMPT": str(self.gen),
        }
        if c.node_rank in c.node_devices:
            # set in the forked rank before the trainer touches CUDA (the zygote never initialises it)
            env["CUDA_VISIBLE_DEVICES"] = c.node_devices[c.node_rank]
        return env

    def spawn(self) -> None:
        c = self.cfg
        self.workers = []
        for local in range(c.nproc_per_node):
            env = self.rank_env(local)
            rank = int(env["RANK"])
            if self.exec_ranks:
                log = c.log_dir / f"rank{rank}.log" if c.log_dir is not None else None
                proc = zygote.exec_rank(sys.executable, c.module, c.train_args, env, log)
                self.workers.append(_Worker(rank, local, proc.pid))
                continue
            pid = os.fork()
            w = _Worker(rank, local, pid)
            if pid == 0:
                self._child(w, env)
            # the child does it too; whichever runs first wins, the other finds it done
            with contextlib.suppress(PermissionError, ProcessLookupError):
                os.setpgid(pid, pid)
            self.workers.append(w)
        self.ev.emit("spawn", gen=self.gen, pids=[w.pid for w in self.workers])

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self._reaped[pid] = os.waitstatus_to_exitcode(status)

    def teardown(self, why: str) -> None:
        t0 = time.monotonic()
        for w in self.workers:
            if w.code is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(w.pid, signal.SIGKILL)
        # everything started for this node except this agent: helpers in other groups, orphans
        tag = os.environ.get(procs.TAG_ENV)
        left: list[procs.Proc] = []
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            self._reap()
            alive = [w for w in self.workers if w.code is None and w.pid not in self._reaped]
            left = [p for p in procs.scan(tag, os.environ.get(procs.NODE_ENV))] if tag else []
            if tag:
                procs.kill(left)
            if not alive and not left:
                break
            time.sleep(0.01)
        for w in self.workers:
            if w.code is None:
                w.code = self._reaped.get(w.pid)
        self.ev.emit(
            "teardown", gen=self.gen, why=why, s=round(time.monotonic() - t0, 4), left=[p.pid for p in left]
        )

    def monitor(self) -> tuple[str, str]:
        """Until the generation ends: ("done"|"restart"|"lost"|"requeue"|"signalled", detail)."""
        with self._store_bounded():
            return self._monitor()

    def _monitor(self) -> tuple[str, str]:
        key = f"restart/{self.gen}"
        next_store = 0.0
        while True:
            self._beat()
            self._reap()
            for w in self.workers:
                if w.code is None and w.pid in self._reaped:
                    w.code = self._reaped[w.pid]
                    if w.code in FATAL_EXIT_CODES:
                        # bad arguments, no checkpoint that verifies, repeated NaN, a failed save:
                        # every restart would end the same way
                        self.fatal_code = w.code
                        detail = (
                            f"node{self.cfg.node_rank} rank{w.rank} exited {w.code} "
                            f"({_code_name(w.code)}, fatal)"
                        )
                        self.ev.emit("failure", gen=self.gen, source="local", rank=w.rank, code=w.code)
                        return "fatal", detail
                    if w.code != 0 and not self.forwarded:
                        detail = f"node{self.cfg.node_rank} rank{w.rank} exited {w.code}"
                        self.store.compare_set(key, "", detail)
                        self.ev.emit("failure", gen=self.gen, source="local", rank=w.rank, code=w.code)
                        return "restart", detail
            if all(w.code is not None for w in self.workers):
                codes = {w.code for w in self.workers}
                if codes == {0}:
                    return "done", ""
                if int(ExitCode.REQUEUE) in codes:
                    return "requeue", str(sorted(codes))
                return "signalled", str(sorted(codes))
            if self.pending_signal is not None:
                sig, self.pending_signal = self.pending_signal, None
                self.forwarded = True
                self.ev.emit("signal", gen=self.gen, name=signal.Signals(sig).name)
                for w in self.workers:
                    if w.code is None:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(w.pid, sig)
            now = time.monotonic()
            if not self.forwarded and now >= next_store:
                # one store round trip per store_poll_s (ranks are reaped every poll_s): cheap on a busy node
                next_store = now + self.cfg.store_poll_s
                if self.store.check([key]):
                    detail = self.store.get(key).decode()
                    self.ev.emit("failure", gen=self.gen, source="remote", detail=detail)
                    if detail.endswith(", fatal)"):
                        self.fatal_code = _fatal_code_of(detail)
                        return "fatal", detail
                    return "restart", detail
                beat_due = now >= self._hb_next
                lost = self._heartbeat()
                if lost:
                    self.store.compare_set(f"lost/{self.gen}", "", lost)
                    self.store.compare_set(f"lost_rank/{self.gen}", "", str(self._lost_peer))
                    self.ev.emit("node_lost", gen=self.gen, detail=lost)
                    return "lost", lost
                if beat_due and self.store.check([f"lost/{self.gen}"]):
                    return "lost", self.store.get(f"lost/{self.gen}").decode()
            time.sleep(self.cfg.poll_s)

    def _finish(self) -> None:
        """Mark this node done; node 0 keeps the store up until every node is done (bounded)."""
        self.store.set(f"done/{self.gen}/{self.cfg.node_rank}", "1")
        if self.cfg.node_rank == 0:
            self.store.set("finished", "1")  # standby agents go home
        tag = os.environ.get(procs.TAG_ENV)
        if tag:  # the ranks' helpers get a moment to exit on their own; whatever stays is killed+recorded
            left = procs.wait_gone(tag, os.environ.get(procs.NODE_ENV), 2.0)
            if left:
                self.ev.emit("leftovers", gen=self.gen, procs=[f"{p.pid} {p.cmdline[:80]}" for p in left])
                self.teardown("leftovers after a clean finish")
        if self.cfg.node_rank != 0:
            return
        deadline = time.monotonic() + self.cfg.hb_timeout_s * 2
        peers = [f"done/{self.gen}/{n}" for n in range(self.cfg.nnodes)]
        while time.monotonic() < deadline and not self.store.check(peers):
            time.sleep(self.cfg.poll_s)

    # --- main ------------------------------------------------------------------------------------
    def _on_signal(self, signum: int, _frame: Any) -> None:
        self.pending_signal = signum

    def run(self) -> int:
        c = self.cfg
        t0 = time.monotonic()
        zygote.become_subreaper()
        if c.log_dir is not None:
            c.log_dir.mkdir(parents=True, exist_ok=True)
        names = [] if self.exec_ranks else zygote.preload(c.module, c.preload)
        self.ev.emit("ready", import_s=round(time.monotonic() - t0, 3), preloaded=len(names))
        for s in _FORWARDED:
            signal.signal(s, self._on_signal)
        try:
            self.connect()
        except Exception as e:  # node 0 never came up
            self.ev.emit("exit", code=int(AgentExit.NODE_LOST), reason=f"store: {e}")
            return int(AgentExit.NODE_LOST)
        if not c.standby:
            self._deadman = nodefail.Deadman(2 * c.hb_timeout_s, self._store_hung).start()
        try:
            return self.standby() if c.standby else self._loop()
        except Exception as e:  # the store host is gone (node 0 lost) or the store broke
            if self.cfg.standby:  # never took over: the job is over, nothing of ours ran
                self.ev.emit("exit", code=0, reason=f"standby: store gone ({e})")
                return 0
            self.ev.emit("store_error", gen=self.gen, error=repr(e))
            self.teardown("store error")
            if self.cfg.node_rank != 0:  # the store's host, node 0, is the one we lost
                self._mark_lost(0, f"store on node0 unreachable: {type(e).__name__}")
            self.ev.emit("exit", code=int(AgentExit.NODE_LOST), reason=f"store: {e}")
            return int(AgentExit.NODE_LOST)

    def _mark_lost(self, peer: int, detail: str) -> None:
        """Under Slurm: mark the lost peer's node DOWN ("lcm: ..."), so slurmctld ends and requeues the
        job now instead of after SlurmdTimeout, and not onto that node (lcm_runner.launch.nodefail)."""
        done = nodefail.mark_lost(peer, detail)
        if done is not None:
            self.ev.emit("node_down", gen=self.gen, **done)

    def _loop(self) -> int:
        c = self.cfg
        while True:
            if self.pending_signal is not None:
                self.ev.emit("exit", code=128 + self.pending_signal, reason="signal before spawn")
                return 128 + self.pending_signal
            failed = self.rendezvous()
            if failed is not None:
                self.ev.emit("node_lost", gen=self.gen, detail=failed)
                if failed.startswith(f"node{self._lost_peer} heartbeat"):  # seen here, not a timeout
                    self._mark_lost(int(self._lost_peer or 0), failed)
                self.ev.emit("exit", code=int(AgentExit.NODE_LOST), reason=failed)
                return int(AgentExit.NODE_LOST)
            self.spawn()
            outcome, detail = self.monitor()
            if outcome == "done":
                self._finish()
                self.ev.emit("exit", code=0, reason="ranks finished")
                return 0
            self.teardown(f"{outcome}: {detail}")
            if outcome == "requeue":
                self.ev.emit("exit", code=int(AgentExit.REQUEUE), reason=detail)
                return int(AgentExit.REQUEUE)
            if outcome == "signalled":
                self.ev.emit(
                    "exit", code=int(AgentExit.FAILURE), reason=f"ranks exited {detail} after a signal"
                )
                return int(AgentExit.FAILURE)
            if outcome == "fatal":
                self.store.compare_set(f"restart/{self.gen}", "", detail)  # the others stop too
                code = self.fatal_code or int(AgentExit.BAD_ARGS)
                self.ev.emit("exit", code=code, reason=detail)
                return code
            if outcome == "lost":
                peer = int(self.store.get(f"lost_rank/{self.gen}").decode())
                if self.gen < c.max_restarts and self._request_takeover(peer, self.gen + 1):
                    self.gen += 1  # a standby becomes node `peer` in the next generation
                    continue
                if peer == self._lost_peer:  # this agent saw the heartbeat stop (not only told)
                    self._mark_lost(peer, detail)
                self.ev.emit("exit", code=int(AgentExit.NODE_LOST), reason=detail)
                return int(AgentExit.NODE_LOST)
            if self.gen >= c.max_restarts:
                self.ev.emit("exit", code=int(AgentExit.FAILURE), reason=f"restarts spent: {detail}")
                return int(AgentExit.FAILURE)
            self.gen += 1


def _code_name(code: int) -> str:
    try:
        return ExitCode(code).name
    except ValueError:
        return f"exit {code}"


def _fatal_code_of(detail: str) -> int:
    """The exit code in a peer's "nodeN rankR exited C (NAME, fatal)" detail."""
    try:
        return int(detail.split(" exited ", 1)[1].split()[0])
    except (IndexError, ValueError):
        return int(AgentExit.BAD_ARGS)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m lcm_runner.launch.agent",
        description="Per-node training agent with in-place (fork) restarts. Trainer args follow '--'.",
    )
    ap.add_argument("--nnodes", type=int, required=True)
    ap.add_argument("--node-rank", type=int, default=-1, help="this node's rank (not with --standby)")
    ap.add_argument(
        "--standby", action="store_true", help="hot spare: preload, wait, take over a lost node's rank"
    )
    ap.add_argument("--nproc-per-node", type=int, required=True)
    ap.add_argument("--master-addr", required=True)
    ap.add_argument("--master-port", type=int, required=True)
    ap.add_argument("--max-restarts", type=int, default=DEFAULT_MAX_RESTARTS)
    ap.add_argument(
        "--join-timeout", type=float, default=DEFAULT_JOIN_TIMEOUT_S, help="seconds for all nodes to (re)join"
    )
    ap.add_argument(
        "--hb-timeout",
        type=float,
        default=DEFAULT_HB_TIMEOUT_S,
        help="seconds without a peer heartbeat = lost",
    )
    ap.add_argument("--module", default="lcm_runner.train")
    ap.add_argument("--preload", default="", help="comma-separated modules (default: torch + trainer pkg)")
    ap.add_argument("--events", type=Path, default=None, help="JSON-lines event file")
    ap.add_argument("--log-dir", type=Path, default=None, help="rank<R>.log per rank (default: inherit)")
    ap.add_argument(
        "--node-devices",
        default="",
        help="NODE_RANK=DEVICES;... : CUDA_VISIBLE_DEVICES of each node's ranks (local launcher's standby)",
    )
    ap.add_argument("train_args", nargs=argparse.REMAINDER)
    return ap


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    args = ns.train_args[1:] if ns.train_args[:1] == ["--"] else ns.train_args
    try:
        node_devices = parse_node_devices(ns.node_devices)
    except ValueError as e:
        print(f"lcm-agent: {e}", file=sys.stderr)
        return int(AgentExit.BAD_ARGS)
    cfg = AgentConfig(
        nnodes=ns.nnodes,
        node_rank=ns.node_rank,
        nproc_per_node=ns.nproc_per_node,
        master_addr=ns.master_addr,
        master_port=ns.master_port,
        max_restarts=ns.max_restarts,
        join_timeout_s=ns.join_timeout,
        hb_timeout_s=ns.hb_timeout,
        module=ns.module,
        preload=[m for m in ns.preload.split(",") if m],
        events=ns.events,
        log_dir=ns.log_dir,
        train_args=args,
        standby=ns.standby,
        node_devices=node_devices,
    )
    try:
        agent = Agent(cfg)
    except ValueError as e:
        print(f"lcm-agent: {e}", file=sys.stderr)
        return int(AgentExit.BAD_ARGS)
    return agent.run()


if __name__ == "__main__":
    raise SystemExit(main())
