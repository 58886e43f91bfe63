"""The agent's coordination: connect to the job's store, rendezvous each generation, fork the ranks,
watch them and the other nodes until the generation ends, then restart in place or exit.

The parts live beside it: store keys (store.py), heartbeats (membership.py), standby takeover
(standby.py), the ranks' processes (ranks.py), the exit policy (policy.py).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lcm_runner.contracts import AgentExit
from lcm_runner.launch import nodefail, zygote
from lcm_runner.launch.agent import policy, standby
from lcm_runner.launch.agent import store as keys
from lcm_runner.launch.agent.config import AgentConfig
from lcm_runner.launch.agent.events import Events
from lcm_runner.launch.agent.membership import Membership
from lcm_runner.launch.agent.ranks import FORWARDED, Ranks


class Agent:
    def __init__(self, cfg: AgentConfig) -> None:
        cfg.validate()
        self.cfg = cfg
        self.ev = Events(cfg.events, cfg.node_rank)
        self.store: Any = None
        self.gen = 0
        self.ranks = Ranks(cfg, self.ev)
        self.members = Membership(cfg)
        self.pending_signal: int | None = None
        self.forwarded = False
        self.fatal_code = 0  # the trainer exit code that ended the job for good (FATAL_EXIT_CODES)
        self._deadman: nodefail.Deadman | None = None  # bounds a store call that hangs (partition)

    # --- store -----------------------------------------------------------------------------------
    def connect(self) -> None:
        c = self.cfg
        is_host = c.node_rank == 0 and not c.standby
        self.store = keys.connect(c.master_addr, c.master_port, is_host, c.join_timeout_s, c.hb_timeout_s)

    @contextlib.contextmanager
    def _store_bounded(self) -> Iterator[None]:
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
        self.ranks.teardown(self.gen, "store call blocked")
        if self.cfg.node_rank != 0:
            self._mark_lost(0, f"store on node0 silent {silent_s:.1f}s")
        self.ev.emit("exit", code=int(AgentExit.NODE_LOST), reason=f"store call blocked {silent_s:.1f}s")
        os._exit(int(AgentExit.NODE_LOST))

    def _mark_lost(self, peer: int, detail: str) -> None:
        """Under Slurm: mark the lost peer's node DOWN ("lcm: ..."), so slurmctld ends and requeues the
        job now instead of after SlurmdTimeout, and not onto that node (lcm_runner.launch.nodefail)."""
        done = nodefail.mark_lost(peer, detail)
        if done is not None:
            self.ev.emit("node_down", gen=self.gen, **done)

    # --- hot spares (standby.py) -----------------------------------------------------------------
    def _request_takeover(self, peer: int, gen: int) -> bool:
        return standby.request_takeover(self.store, self.ev, self.members, self.cfg.node_rank, peer, gen)

    def _announce(self, me: str) -> int:
        return standby.announce(self.store, self.ev, me)

    def _claim_takeover(self, seen: int, me: str) -> tuple[int, bool]:
        seen, gen = standby.claim_takeover(self.store, self.ev, self.cfg, seen, me)
        if gen is not None:
            self.gen = gen
        return seen, gen is not None

    def standby(self) -> int:
        """Wait, warm, for a takeover request; then become the lost node and run its ranks."""
        me = f"{os.uname().nodename}:{os.getpid()}"
        seen = self._announce(me)
        while True:
            if self.pending_signal is not None:
                return 128 + self.pending_signal
            if self.store.check([keys.FINISHED]):
                self.ev.emit("exit", code=0, reason="standby not needed: the job finished")
                return 0
            seen, claimed = self._claim_takeover(seen, me)
            if claimed:
                return self._loop()
            time.sleep(self.cfg.store_poll_s)

    # --- one generation --------------------------------------------------------------------------
    def rank_env(self, local: int) -> dict[str, str]:
        """The torchrun environment of local rank `local` of this node in the current generation."""
        return self.ranks.rank_env(local, self.gen)

    def rendezvous(self) -> str | None:
        """All agents join generation ``gen``; returns a reason when that fails within join_timeout_s."""
        with self._store_bounded():
            return self._rendezvous()

    def _rendezvous(self) -> str | None:
        t0 = time.monotonic()
        key = keys.join(self.gen)
        self.store.add(key, 1)
        deadline = t0 + self.cfg.join_timeout_s
        while True:
            self._beat()
            joined = self.store.add(key, 0)
            if joined >= self.cfg.nnodes:
                break
            if self.store.check([keys.lost(self.gen)]):
                return self.store.get(keys.lost(self.gen)).decode()
            if time.monotonic() > deadline:
                return (
                    f"only {joined}/{self.cfg.nnodes} nodes joined generation {self.gen} "
                    f"within {self.cfg.join_timeout_s}s"
                )
            lost = self.members.beat(self.store, self.gen)
            if lost and self.gen > 0:
                peer = self.members.lost_peer
                if peer is not None and self._request_takeover(peer, self.gen):
                    deadline = max(deadline, time.monotonic() + self.cfg.join_timeout_s)
                    continue
                return lost
            time.sleep(self.cfg.poll_s)
        self.members.new_generation()
        self.ev.emit("rendezvous", gen=self.gen, wait_s=round(time.monotonic() - t0, 4))
        return None

    def monitor(self) -> tuple[str, str]:
        """Until the generation ends: (a policy outcome: DONE, RESTART, LOST, ..., detail)."""
        with self._store_bounded():
            return self._monitor()

    def _monitor(self) -> tuple[str, str]:
        key = keys.restart(self.gen)
        next_store = 0.0
        while True:
            self._beat()
            self.ranks.reap()
            for w in self.ranks.newly_exited():
                outcome = policy.rank_outcome(w.code or 0, self.forwarded)
                if outcome is None:
                    continue
                fatal = outcome == policy.FATAL
                detail = policy.failure_detail(self.cfg.node_rank, w.rank, w.code or 0, fatal)
                if fatal:
                    self.fatal_code = w.code or 0
                else:
                    self.store.compare_set(key, "", detail)
                self.ev.emit("failure", gen=self.gen, source="local", rank=w.rank, code=w.code)
                return outcome, detail
            if self.ranks.all_exited():
                return policy.all_exited(self.ranks.codes())
            if self.pending_signal is not None:
                sig, self.pending_signal = self.pending_signal, None
                self.forwarded = True
                self.ev.emit("signal", gen=self.gen, name=signal.Signals(sig).name)
                self.ranks.forward(sig)
            now = time.monotonic()
            self.ranks.tick(now)
            if not self.forwarded and now >= next_store:
                # one store round trip per store_poll_s (ranks are reaped every poll_s): cheap on a busy node
                next_store = now + self.cfg.store_poll_s
                if self.store.check([key]):
                    detail = self.store.get(key).decode()
                    self.ev.emit("failure", gen=self.gen, source="remote", detail=detail)
                    if policy.is_fatal_detail(detail):
                        self.fatal_code = policy.fatal_code_of(detail)
                        return policy.FATAL, detail
                    return policy.RESTART, detail
                beat_due = self.members.due(now)
                lost = self.members.beat(self.store, self.gen)
                if lost:
                    self.store.compare_set(keys.lost(self.gen), "", lost)
                    self.store.compare_set(keys.lost_rank(self.gen), "", str(self.members.lost_peer))
                    self.ev.emit("node_lost", gen=self.gen, detail=lost)
                    return policy.LOST, lost
                if beat_due and self.store.check([keys.lost(self.gen)]):
                    return policy.LOST, self.store.get(keys.lost(self.gen)).decode()
            time.sleep(self.cfg.poll_s)

    def _finish(self) -> None:
        """Mark this node done; node 0 keeps the store up until every node is done (bounded)."""
        self.store.set(keys.done(self.gen, self.cfg.node_rank), "1")
        if self.cfg.node_rank == 0:
            self.store.set(keys.FINISHED, "1")  # standby agents go home
        self.ranks.clear_leftovers(self.gen)
        if self.cfg.node_rank != 0:
            return
        deadline = time.monotonic() + self.cfg.hb_timeout_s * 2
        peers = [keys.done(self.gen, n) for n in range(self.cfg.nnodes)]
        while time.monotonic() < deadline and not self.store.check(peers):
            time.sleep(self.cfg.poll_s)

    # --- main ------------------------------------------------------------------------------------
    def _on_signal(self, signum: int, _frame: Any) -> None:
        self.pending_signal = signum

    def run(self) -> int:
        try:
            self._make_host_copy_dir()
            return self._run()
        finally:
            self.ranks.stop_spares()
            if self.cfg.host_copy_dir is not None:
                shutil.rmtree(self.cfg.host_copy_dir, ignore_errors=True)

    def _make_host_copy_dir(self) -> None:
        """--host-copy: a directory of this agent's for its ranks' host copies (removed when it exits)."""
        c = self.cfg
        if not c.host_copy:
            return
        try:
            made = tempfile.mkdtemp(prefix=f"lcm-host-copy-node{c.node_rank}-", dir=c.host_copy_root)
            c.host_copy_dir = Path(made)
        except OSError as e:  # no host copy: restarts load from disk, as without the flag
            self.ev.emit("host_copy", error=f"{c.host_copy_root}: {e}")
            return
        self.ev.emit("host_copy", dir=str(c.host_copy_dir))

    def _run(self) -> int:
        c = self.cfg
        t0 = time.monotonic()
        zygote.become_subreaper()
        if c.log_dir is not None:
            c.log_dir.mkdir(parents=True, exist_ok=True)
        names = [] if self.ranks.exec_ranks else zygote.preload(c.module, c.preload)
        self.ev.emit("ready", import_s=round(time.monotonic() - t0, 3), preloaded=len(names))
        for s in FORWARDED:
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
            self.ranks.teardown(self.gen, "store error")
            if self.cfg.node_rank != 0:  # the store's host, node 0, is the one we lost
                self._mark_lost(0, f"store on node0 unreachable: {type(e).__name__}")
            self.ev.emit("exit", code=int(AgentExit.NODE_LOST), reason=f"store: {e}")
            return int(AgentExit.NODE_LOST)

    def _loop(self) -> int:
        c = self.cfg
        while True:
            if self.pending_signal is not None:
                self.ev.emit("exit", code=128 + self.pending_signal, reason="signal before spawn")
                return 128 + self.pending_signal
            failed = self.rendezvous()
            if failed is not None:
                self.ev.emit("node_lost", gen=self.gen, detail=failed)
                seen = self.members.lost_peer
                if failed.startswith(f"node{seen} heartbeat"):  # seen here, not a timeout
                    self._mark_lost(int(seen or 0), failed)
                self.ev.emit("exit", code=int(AgentExit.NODE_LOST), reason=failed)
                return int(AgentExit.NODE_LOST)
            self.ranks.spawn(self.gen)
            outcome, detail = self.monitor()
            if outcome == policy.DONE:
                self._finish()
                self.ev.emit("exit", code=0, reason="ranks finished")
                return 0
            self.ranks.teardown(self.gen, f"{outcome}: {detail}")
            if outcome == policy.FATAL:
                self.store.compare_set(keys.restart(self.gen), "", detail)  # the others stop too
            if outcome == policy.LOST:
                peer = int(self.store.get(keys.lost_rank(self.gen)).decode())
                if self.gen < c.max_restarts and self._request_takeover(peer, self.gen + 1):
                    self.gen += 1  # a standby becomes node `peer` in the next generation
                    continue
                if peer == self.members.lost_peer:  # this agent saw the heartbeat stop (not only told)
                    self._mark_lost(peer, detail)
            end = policy.after(
                outcome, detail, gen=self.gen, max_restarts=c.max_restarts, fatal_code=self.fatal_code
            )
            if end is None:
                self.gen += 1
                continue
            self.ev.emit("exit", code=end.code, reason=end.reason)
            return end.code
