"""The fault matrix's rows; the `matrix` fixture that records them is in tests/conftest.py."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytest


@dataclass
class Row:
    fault: str
    injected: str
    detected_s: float | None  # fault -> detected (seconds); None where detection is not timed
    recovered: bool
    downtime_s: float | None  # fault (or restart) -> first new step
    steps_lost: int  # steps lost beyond the last good checkpoint (must be 0)
    good_ckpts_lost: int  # known-good checkpoints lost (must be 0)
    notes: str = ""
    test: str = ""
    ts: float = field(default_factory=time.time)


class Matrix:
    def __init__(self, path: Path | None):
        self.path = path

    def record(self, row: Row, request: pytest.FixtureRequest | None = None) -> None:
        if request is not None:
            row.test = request.node.nodeid
        print(f"fault-matrix: {json.dumps(asdict(row))}")
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a") as f:
                f.write(json.dumps(asdict(row)) + "\n")
