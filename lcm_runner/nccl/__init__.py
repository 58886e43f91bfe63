"""NCCL log profiling: parse NCCL_DEBUG=INFO logs per rank and check them against the cluster spec.

from lcm_runner.nccl import profile_dir
summary = profile_dir("runs/<run>/nccl", cluster)   # dict: ranks, flags, ok
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lcm_runner.nccl.checks import Expect, Flag, check, profile_summary
from lcm_runner.nccl.logparse import ProcessLog, find_logs, parse_file, parse_text

__all__ = [
    "Expect",
    "Flag",
    "ProcessLog",
    "check",
    "find_logs",
    "parse_file",
    "parse_text",
    "profile_dir",
    "profile_summary",
]


def profile_dir(directory: str | Path, cluster: dict[str, Any] | None = None) -> dict[str, Any]:
    """Parse every NCCL log of a directory and check it against the spec (None: no expectations)."""
    logs = [parse_file(p) for p in find_logs(directory)]
    summary = profile_summary(logs, Expect.from_cluster(cluster))
    summary["directory"] = str(directory)
    return summary
