"""Hot standby takeover: a spare agent announces itself in the store and waits; a survivor that finds a
node (other than node 0, the store's host) lost posts a takeover request; the first free standby claims
it (compare-and-set) and becomes that node rank in the next generation."""

from __future__ import annotations

import json
from typing import Any

from lcm_runner.launch.agent import store as keys
from lcm_runner.launch.agent.config import AgentConfig
from lcm_runner.launch.agent.events import Events
from lcm_runner.launch.agent.membership import Membership


def request_takeover(
    store: Any, ev: Events, members: Membership, node_rank: int, peer: int, gen: int
) -> bool:
    """Ask a standby agent to take `peer`'s node rank at generation `gen`; False when none is free.
    Several survivors may ask: the first one posts the request, the others find it posted."""
    if peer == 0:
        return False  # node 0 hosts the store: losing it ends the job for everyone
    free = store.add(keys.STANDBY_COUNT, 0) - store.add(keys.STANDBY_CLAIMED, 0)
    key = keys.takeover_by(gen, peer)
    mine = str(node_rank)
    if store.check([key]):
        return True
    if free <= 0:
        return False
    if store.compare_set(key, "", mine).decode() == mine:
        n = store.add(keys.TAKEOVER_SEQ, 1)
        store.set(keys.takeover(n), json.dumps({"gen": gen, "node_rank": peer}))
        ev.emit("takeover_requested", gen=gen, node=peer)
    members.await_replacement(peer)
    return True


def announce(store: Any, ev: Events, me: str) -> int:
    """Count this standby as free; returns the last takeover request it need not look at."""
    seen = store.add(keys.TAKEOVER_SEQ, 0)  # before announcing: no request can fall in between
    store.add(keys.STANDBY_COUNT, 1)
    ev.emit("standby", id=me)
    return seen


def claim_takeover(store: Any, ev: Events, cfg: AgentConfig, seen: int, me: str) -> tuple[int, int | None]:
    """Look at the takeover requests after `seen`; claim the first one still free (compare-and-set)
    and become that node (cfg.node_rank, cfg.standby, the event log's node). Returns (last request
    seen, the generation to join, None when nothing was claimed)."""
    latest = store.add(keys.TAKEOVER_SEQ, 0)
    while seen < latest:
        seen += 1
        req = json.loads(store.get(keys.takeover(seen)))
        if store.compare_set(keys.claim(seen), "", me).decode() == me:
            store.add(keys.STANDBY_CLAIMED, 1)
            cfg.node_rank = int(req["node_rank"])
            cfg.standby = False
            gen = int(req["gen"])
            ev.node_rank = cfg.node_rank
            devices = cfg.node_devices.get(cfg.node_rank)
            ev.emit("takeover", gen=gen, node=cfg.node_rank, id=me, devices=devices)
            return seen, gen
    return seen, None
