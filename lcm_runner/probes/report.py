"""One run of the probes: its JSON (`--json`, and `<node>.json` under `--peers`), its Markdown table
(`--markdown`) and the lines it prints."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .result import FAIL, PASS, ProbeResult, fmt

SCHEMA = 1


@dataclass
class ProbeRun:
    node: str
    expectation: dict[str, Any]  # path, gpu, the thresholds used
    started: str  # UTC, ISO 8601
    finished: str = ""
    duration_s: float = 0.0
    environment: dict[str, Any] = field(default_factory=dict)  # versions, devices, NCCL_* as inherited
    options: dict[str, Any] = field(default_factory=dict)  # only, nnodes, node_rank, master, sizes
    results: list[ProbeResult] = field(default_factory=list)
    peers: dict[str, Any] | None = None

    @property
    def status(self) -> str:
        return FAIL if any(r.status == FAIL for r in self.results) else PASS

    def exit_code(self) -> int:
        return 1 if self.status == FAIL else 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "kind": "lcm-probe",
            "node": self.node,
            "status": self.status,
            "started": self.started,
            "finished": self.finished,
            "duration_s": self.duration_s,
            "environment": self.environment,
            "expectation": self.expectation,
            "options": self.options,
            "failed": [r.name for r in self.results if r.status == FAIL],
            # "checks", as lcm-runner health check's report: playbooks/tasks/burn_in.yml reads both alike
            "checks": [r.to_dict() for r in self.results],
            "peers": self.peers,
        }


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(run: ProbeRun) -> str:
    env = run.environment
    devices = ", ".join(f"{d['label']}: {d['name']}" for d in env.get("devices", [])) or "-"
    lines = [
        f"# Burn-in probes: {run.node} ({run.status.upper()})",
        "",
        f"{run.started} .. {run.finished} ({run.duration_s:.1f} s) on {env.get('hostname', '?')}; "
        f"torch {env.get('torch', '-')}, CUDA {env.get('cuda') or '-'}, NCCL {env.get('nccl') or '-'}",
        "",
        f"Devices: {_cell(devices)}",
        "",
        "| check | scope | status | value | threshold | unit | per GPU | reason |",
        "|---|---|---|---:|---:|---|---|---|",
    ]
    for r in run.results:
        per = " / ".join(fmt(v) for v in r.per_gpu) if r.per_gpu else ""
        lines.append(
            f"| {r.name} | {r.scope} | {r.status.upper()} | {fmt(r.value)} | {fmt(r.threshold)} | {r.unit} "
            f"| {per} | {_cell(r.reason)} |"
        )
    for r in run.results:
        rows = r.details.get("rows") if r.name == "allreduce" else None
        if rows:
            lines += [
                "",
                f"All-reduce sweep ({r.details['ranks']} ranks, {r.details['backend']}, float32 sum; "
                "the busbw at the largest size is the figure compared):",
                "",
                "| size (B) | count | time (us) | algbw (GB/s) | busbw (GB/s) |",
                "|---:|---:|---:|---:|---:|",
            ]
            lines += [
                f"| {x['size_bytes']} | {x['count']} | {x['time_us']:.1f} | {x['algbw_gbps']:.2f} "
                f"| {x['busbw_gbps']:.2f} |"
                for x in rows
            ]
    return "\n".join(lines) + "\n"


def summary_line(r: ProbeResult) -> str:
    """One printed line; the reason names the figure and the threshold."""
    scope = f" ({r.scope})" if r.name == "allreduce" else ""
    return f"probe {r.name}{scope}: {r.status.upper()}: {r.reason}"


def write_text(path: str | Path, text: str) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text, encoding="utf-8")


def write_json(path: str | Path, run: ProbeRun) -> None:
    write_text(path, json.dumps(run.to_dict(), indent=2) + "\n")
