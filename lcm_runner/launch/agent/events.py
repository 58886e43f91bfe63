"""The agent's event log: one JSON line per event in --events (read by the stages), echoed to stderr."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any


class Events:
    def __init__(self, path: Path | None, node_rank: int) -> None:
        self.node_rank = node_rank  # changes when a standby takes over a lost node's rank
        self._fh = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = path.open("a", buffering=1)

    def emit(self, event: str, **data: Any) -> None:
        rec = {"ts": time.time(), "event": event, "node_rank": self.node_rank, "pid": os.getpid(), **data}
        line = json.dumps(rec)
        if self._fh is not None:
            self._fh.write(line + "\n")
        print(f"[lcm-agent node{self.node_rank}] {line}", file=sys.stderr, flush=True)
