"""The expectation file a node's probes are checked against (written by the Ansible role from the
cluster spec's `cluster.health.thresholds.<model>`; docs/probes.md).

    {"schema": 1, "node": "lab-node1",
     "gpu": {"model": "h200", "count": 8},
     "probes": {"gemm_tflops": 550.0, "copy_gbps": 3500.0, "busbw_node_gbps": 300.0,
                "busbw_cluster_gbps": 0.0, "peer_ratio": 0.8,
                "gemm_n": 8192, "copy_mib": 4096, "allreduce_max_mib": 1024}}

Keys this module does not use are ignored. A threshold is needed only by the probe that is compared
with it (busbw_cluster_gbps only across nodes); a threshold of 0 records the figure without a floor.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = 1
PROBES = ("gemm", "copy", "allreduce")
DEFAULT_PEER_RATIO = 0.8
# GPU sizes when the file has none (the CPU sizes are fixed: cpu_sizes()).
DEFAULT_GEMM_N = 8192
DEFAULT_COPY_MIB = 4096
DEFAULT_ALLREDUCE_MAX_MIB = 1024
_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")  # also a file name under --peers


class ExpectationError(ValueError):
    """The expectation file is missing, unreadable or wrong (exit 2, nothing measured)."""


@dataclass(frozen=True)
class Expectation:
    path: str
    node: str
    gpu_model: str
    gpu_count: int
    thresholds: dict[str, float]  # gemm_tflops, copy_gbps, busbw_node_gbps, busbw_cluster_gbps (present ones)
    peer_ratio: float = DEFAULT_PEER_RATIO
    gemm_n: int = DEFAULT_GEMM_N
    copy_mib: int = DEFAULT_COPY_MIB
    allreduce_max_mib: int = DEFAULT_ALLREDUCE_MAX_MIB
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    def threshold(self, key: str) -> float:
        return self.thresholds[key]


THRESHOLD_KEYS = ("gemm_tflops", "copy_gbps", "busbw_node_gbps", "busbw_cluster_gbps")


def _number(where: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ExpectationError(f"{where}: must be a number, got {v!r}")
    if v < 0:
        raise ExpectationError(f"{where}: must be >= 0, got {v!r}")
    return float(v)


def _size(where: str, v: Any, power_of_two: bool = False) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ExpectationError(f"{where}: must be a whole number >= 1, got {v!r}")
    if power_of_two and v & (v - 1):
        raise ExpectationError(f"{where}: must be a power of two (the sweep doubles up to it), got {v}")
    return v


def parse_expectation(doc: Any, path: str = "<expectation>") -> Expectation:
    if not isinstance(doc, dict):
        raise ExpectationError(f"{path}: must be a JSON object, got {type(doc).__name__}")
    if doc.get("schema") != SCHEMA:
        raise ExpectationError(f"{path}: schema: must be {SCHEMA}, got {doc.get('schema')!r}")
    node = doc.get("node")
    if not isinstance(node, str) or not _NODE.match(node):
        raise ExpectationError(f"{path}: node: must be a host name ([A-Za-z0-9._-]), got {node!r}")
    gpu = doc.get("gpu")
    if not isinstance(gpu, dict):
        raise ExpectationError(f"{path}: gpu: must be an object with model and count, got {gpu!r}")
    model, count = gpu.get("model"), gpu.get("count")
    if not isinstance(model, str) or not model:
        raise ExpectationError(f"{path}: gpu.model: must be a name ('none' on CPU), got {model!r}")
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ExpectationError(f"{path}: gpu.count: must be a whole number >= 0, got {count!r}")
    probes = doc.get("probes")
    if not isinstance(probes, dict):
        raise ExpectationError(f"{path}: probes: must be an object of thresholds, got {probes!r}")
    thresholds = {
        k: _number(f"{path}: probes.{k}", probes[k]) for k in THRESHOLD_KEYS if probes.get(k) is not None
    }
    ratio = probes.get("peer_ratio", DEFAULT_PEER_RATIO)
    ratio = _number(f"{path}: probes.peer_ratio", ratio)
    if not 0 < ratio <= 1:
        raise ExpectationError(f"{path}: probes.peer_ratio: must be in (0, 1], got {ratio}")
    return Expectation(
        path=path,
        node=node,
        gpu_model=model,
        gpu_count=count,
        thresholds=thresholds,
        peer_ratio=ratio,
        gemm_n=_size(f"{path}: probes.gemm_n", probes.get("gemm_n", DEFAULT_GEMM_N)),
        copy_mib=_size(f"{path}: probes.copy_mib", probes.get("copy_mib", DEFAULT_COPY_MIB)),
        allreduce_max_mib=_size(
            f"{path}: probes.allreduce_max_mib",
            probes.get("allreduce_max_mib", DEFAULT_ALLREDUCE_MAX_MIB),
            power_of_two=True,
        ),
        raw=doc,
    )


def load_expectation(path: str | Path) -> Expectation:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ExpectationError(f"{p}: cannot read the expectation file: {e.strerror or e}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ExpectationError(f"{p}: not JSON: {e.msg} (line {e.lineno}, column {e.colno})") from None
    return parse_expectation(doc, str(p))


def require_thresholds(exp: Expectation, only: tuple[str, ...], nnodes: int) -> None:
    """The thresholds the selected probes are compared with must be there (exit 2 otherwise)."""
    needed = {"gemm": ["gemm_tflops"], "copy": ["copy_gbps"], "allreduce": [allreduce_key(nnodes)]}
    missing = [k for probe in only for k in needed[probe] if k not in exp.thresholds]
    if missing:
        raise ExpectationError(
            f"{exp.path}: probes.{', probes.'.join(missing)}: missing (needed by --only {','.join(only)}; "
            "0 records the figure without a floor)"
        )


def allreduce_key(nnodes: int) -> str:
    return "busbw_cluster_gbps" if nnodes > 1 else "busbw_node_gbps"
