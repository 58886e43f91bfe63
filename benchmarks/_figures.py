"""One row of docs/performance.md (benchmarks/performance.py) and the helpers every section's figures use."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"


@dataclass
class Figure:
    name: str
    target: str
    value: str  # the ratio (or the figure the target is stated in)
    absolute: str
    met: bool | None  # None: not measured
    source: str
    limit: str = ""


def _rel(p: Path) -> str:
    return str(p.relative_to(REPO))


def _newest(pattern: str, root: Path = RESULTS) -> Path | None:
    found = sorted(root.glob(pattern))
    return found[-1] if found else None


def _missing(name: str, target: str, why: str) -> Figure:
    return Figure(name, target, "not measured", "", None, "", why)
