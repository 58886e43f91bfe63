"""The job's agent store: a TCPStore hosted by the node-0 agent, and the names of its keys.

Every key the agents share is named here (one function or constant each), so the protocol can be read
in one place; nothing else spells a key out.

    hb/<node>                  heartbeat counter of a node's agent (add 1 per beat)
    join/<gen>                 agents that joined generation gen (add 1 each)
    done/<gen>/<node>          the node's ranks finished generation gen cleanly
    finished                   node 0 finished the job: unused standbys exit
    restart/<gen>              first failure seen in generation gen ("nodeN rankR exited C[ (NAME, fatal)]")
    lost/<gen>                 first node loss seen in generation gen (a reason)
    lost_rank/<gen>            the node rank of that lost node
    standby/count              standby agents that announced themselves
    standby/claimed            standby agents that claimed a takeover
    takeover/seq               takeover requests posted so far (n = 1, 2, ...)
    takeover/<n>               request n: {"gen": g, "node_rank": r}
    takeover_by/<gen>/<node>   the survivor that posted the request to replace node at gen
    claim/<n>                  the standby that claimed request n (compare-and-set)
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

FINISHED = "finished"
STANDBY_COUNT = "standby/count"
STANDBY_CLAIMED = "standby/claimed"
TAKEOVER_SEQ = "takeover/seq"


def heartbeat(node: int) -> str:
    return f"hb/{node}"


def join(gen: int) -> str:
    return f"join/{gen}"


def done(gen: int, node: int) -> str:
    return f"done/{gen}/{node}"


def restart(gen: int) -> str:
    return f"restart/{gen}"


def lost(gen: int) -> str:
    return f"lost/{gen}"


def lost_rank(gen: int) -> str:
    return f"lost_rank/{gen}"


def takeover(n: int) -> str:
    return f"takeover/{n}"


def takeover_by(gen: int, node: int) -> str:
    return f"takeover_by/{gen}/{node}"


def claim(n: int) -> str:
    return f"claim/{n}"


def connect(
    master_addr: str, master_port: int, is_host: bool, join_timeout_s: float, call_timeout_s: float
) -> Any:
    """The job's TCPStore: hosted here when `is_host` (node 0, not a standby), else a client of it;
    each call then times out after `call_timeout_s` (the heartbeat timeout)."""
    import torch.distributed as dist

    store = dist.TCPStore(
        master_addr,
        master_port,
        None,
        is_host,
        timedelta(seconds=join_timeout_s),
        wait_for_workers=False,
    )
    store.set_timeout(timedelta(seconds=call_timeout_s))
    return store
