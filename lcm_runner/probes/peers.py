"""The comparison with the other nodes: `--peers DIR` is a directory on shared storage where every node
leaves its last probe result as `<node>.json` (the JSON of `--json`).

A node's figure below `peer_ratio` x the median of the other nodes' figures (same check, same scope)
fails, whatever its threshold ("a node whose bandwidth is half its neighbours'"). The median is of the
other nodes' last results, skipped checks and unreadable files left out; a cluster-scope all-reduce is
one figure shared by every node and is not compared. Then this node's result replaces its own file.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .result import SKIP, ProbeResult, fmt


@dataclass
class Peers:
    directory: str
    figures: dict[tuple[str, str], dict[str, float]] = field(
        default_factory=dict
    )  # (name, scope) -> node -> v
    ignored: list[str] = field(default_factory=list)  # files left out, and why

    def to_dict(self) -> dict[str, Any]:
        return {
            "directory": self.directory,
            "nodes": sorted({n for per in self.figures.values() for n in per}),
            "ignored": self.ignored,
        }


def load_peers(directory: str | Path, node: str) -> Peers:
    d = Path(directory)
    peers = Peers(str(d))
    for f in sorted(d.glob("*.json")):
        if f.stem == node:
            continue
        try:
            doc = json.loads(f.read_text(encoding="utf-8"))
            results = doc["checks"]
            other = str(doc.get("node") or f.stem)
            if not isinstance(results, list):
                raise TypeError("checks is not a list")
        except (OSError, ValueError, KeyError, TypeError) as e:
            peers.ignored.append(f"{f.name}: {type(e).__name__}: {e}")
            continue
        if other == node:
            peers.ignored.append(f"{f.name}: this node's own result ({node})")
            continue
        for r in results:
            if not isinstance(r, dict) or r.get("status") == SKIP:
                continue
            v = r.get("value")
            if isinstance(v, bool) or not isinstance(v, int | float):
                continue
            key = (str(r.get("name")), str(r.get("scope", "node")))
            peers.figures.setdefault(key, {})[other] = float(v)
    return peers


def compare(results: list[ProbeResult], peers: Peers, ratio: float) -> None:
    """Fail each figure below ratio x the median of the other nodes' same figure (in place)."""
    for r in results:
        if r.status == SKIP or r.value is None or r.scope != "node" or r.name == "devices":
            continue
        others = peers.figures.get((r.name, r.scope), {})
        if not others:
            r.details["peers"] = {"nodes": 0, "note": "no other node's figure yet"}
            continue
        med = statistics.median(others.values())
        r.details["peers"] = {"nodes": len(others), "median": med, "ratio": ratio, "figures": others}
        if r.value < ratio * med:
            r.fail(
                f"{fmt(r.value)} {r.unit} < {ratio:g} x {fmt(med)} {r.unit} "
                f"(the median of {len(others)} other node(s) in {peers.directory})"
            )


def write_own(directory: str | Path, node: str, doc: dict[str, Any]) -> Path:
    """Replace <node>.json atomically (the others may be reading the directory)."""
    d = Path(directory)
    fd, tmp = tempfile.mkstemp(prefix=f".{node}.", suffix=".tmp", dir=d)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=2)
            fh.write("\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, d / f"{node}.json")
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return d / f"{node}.json"
