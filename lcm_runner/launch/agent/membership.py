"""Heartbeats and membership: each agent beats through the store and watches its peers' beats; a peer
silent for hb_timeout_s is lost (its node, or at least its agent, is gone)."""

from __future__ import annotations

import time
from typing import Any

from lcm_runner.launch.agent import store as keys
from lcm_runner.launch.agent.config import AgentConfig


class Membership:
    def __init__(self, cfg: AgentConfig) -> None:
        self.cfg = cfg  # shared with the agent: node_rank changes when a standby takes over
        self.next_beat = 0.0  # monotonic time of the next beat
        self._last_beat = 0.0
        self._peer_seen: dict[int, tuple[int, float]] = {}  # peer -> (its beat count, when it changed)
        self.lost_peer: int | None = None  # the last peer this agent saw go silent
        self.awaiting: set[int] = set()  # lost peers a standby was asked to replace

    def due(self, now: float) -> bool:
        return now >= self.next_beat

    def beat(self, store: Any, gen: int) -> str | None:
        """Beat, and return the first peer whose beat stopped (None when all are alive)."""
        now = time.monotonic()
        if now < self.next_beat:
            return None
        self.next_beat = now + self.cfg.hb_interval_s
        # An agent that was itself descheduled (a busy node) cannot judge its peers' silence: it restarts
        # their clocks instead of declaring a loss it could not have observed.
        starved = self._last_beat > 0 and now - self._last_beat > self.cfg.hb_timeout_s / 2
        self._last_beat = now
        store.add(keys.heartbeat(self.cfg.node_rank), 1)
        for peer in range(self.cfg.nnodes):
            if peer == self.cfg.node_rank or peer in self.awaiting:
                continue
            if store.check([keys.done(gen, peer)]):
                continue
            count = store.add(keys.heartbeat(peer), 0)
            last = self._peer_seen.get(peer)
            if last is None or last[0] != count or starved:
                self._peer_seen[peer] = (count, now)
            elif now - last[1] > self.cfg.hb_timeout_s:
                self.lost_peer = peer
                return f"node{peer} heartbeat stopped {now - last[1]:.1f}s ago"
        return None

    def await_replacement(self, peer: int) -> None:
        """A standby was asked to take `peer`'s rank: its silence is expected until it rejoins."""
        self.awaiting.add(peer)
        self._peer_seen.pop(peer, None)

    def new_generation(self) -> None:
        """Every node joined: start every peer's clock afresh."""
        self._peer_seen.clear()
        self.awaiting.clear()
