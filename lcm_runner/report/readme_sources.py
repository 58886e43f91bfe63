"""The committed result files README's Measured table reads, and the helpers its rows use
(lcm_runner/report/readme.py renders the table; readme_rows.py computes each row)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

BEGIN = "<!-- measured:begin -->"
END = "<!-- measured:end -->"
REPO = Path(__file__).resolve().parents[2]

# The committed files the rows read (repository-relative).
STAGES_RUN1 = "docs/results/h200x2-stages/run-1"
STAGES_RUN2 = "docs/results/h200x2-stages/run-2-fault"
LAB_SLURM_FAULT = "docs/results/lab-slurm/stages/fault.json"
CONVERGE = "benchmarks/results/converge-20261207-124016.json"
# the lab's single node faults, last run alone (docs/reliability.md)
MATRIX_LAB_NODES = "docs/results/faults/lab-node-faults.jsonl"
MATRIX_CPU = "docs/results/faults/matrix-cpu.jsonl"
ENGINE = "docs/results/h200-engine/summary.json"
INTEGRITY_TELEMETRY = "docs/results/h200-integrity/telemetry/rank0.jsonl"
INTEGRITY_CHECKSUM = "docs/results/h200-integrity/checksum-vm-20261201-090720.json"

# Where the methods are described (not read for numbers).
CONTEXT_DOCS = (
    "docs/results/h200x2-stages/README.md",
    "docs/results/h200-engine/README.md",
    "docs/results/h200-engine-vs-megatron/README.md",
    "docs/results/h200-integrity/README.md",
    "docs/reliability.md",
    "docs/reliability-nodes.md",
    "docs/lab.md",
    "docs/results/h200-verify/README.md",
    "docs/nodes.md",
)


class ResultsError(Exception):
    """A source file is missing, unreadable or lacks a value a row needs (the message names it)."""


@dataclass
class Row:
    what: str
    where: str
    value: str
    sources: list[str] = field(default_factory=list)


class Results:
    """Reads the committed files under a repository root; every read is remembered as a row source."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, rel: str) -> Path:
        p = self.root / rel
        if not p.is_file():
            raise ResultsError(f"{rel}: missing (a row of README.md's Measured table reads it)")
        return p

    def json(self, rel: str) -> Any:
        try:
            return json.loads(self._path(rel).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ResultsError(f"{rel}: unreadable: {e}") from e

    def jsonl(self, rel: str) -> list[dict[str, Any]]:
        try:
            text = self._path(rel).read_text(encoding="utf-8")
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        except (OSError, ValueError) as e:
            raise ResultsError(f"{rel}: unreadable: {e}") from e

    def yaml(self, rel: str) -> Any:
        try:
            return yaml.safe_load(self._path(rel).read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as e:
            raise ResultsError(f"{rel}: unreadable: {e}") from e


def _get(doc: Any, rel: str, *keys: str | int) -> Any:
    cur = doc
    for k in keys:
        try:
            cur = cur[k]
        except (KeyError, IndexError, TypeError):
            raise ResultsError(f"{rel}: no {'.'.join(map(str, keys))}") from None
    if cur is None:
        raise ResultsError(f"{rel}: {'.'.join(map(str, keys))} is null (not measured)")
    return cur


def _num(x: float, nd: int) -> str:
    return f"{x:.{nd}f}"


def _span(values: Iterable[float], nd: int) -> str:
    """One value, or "lo-hi" over several runs of the same measure, at nd decimals."""
    vals = sorted(values)
    lo, hi = _num(vals[0], nd), _num(vals[-1], nd)
    return lo if lo == hi else f"{lo}-{hi}"


def _note_num(rel: str, row: dict[str, Any], pattern: str) -> float:
    m = re.search(pattern, str(row.get("notes", "")))
    if not m:
        raise ResultsError(f"{rel}: fault {row.get('fault')!r}: notes lack {pattern!r}")
    return float(m.group(1))


def _matrix_rows(res: Results, rel: str, fault: str) -> list[dict[str, Any]]:
    rows = [r for r in res.jsonl(rel) if r.get("fault") == fault]
    if not rows:
        raise ResultsError(f"{rel}: no row for the fault {fault!r}")
    return rows


# --- rows ---------------------------------------------------------------------------------------------
