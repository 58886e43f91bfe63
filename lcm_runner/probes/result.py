"""A check's outcome, and the comparison of a measured figure with its threshold.

The figure compared is the minimum over the local GPUs (a node is as fast as its slowest GPU); besides,
a GPU whose figure is below `ratio` x the median of the node's other GPUs fails even above the
threshold ("a GPU at half its neighbours' figure").
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

PASS, FAIL, SKIP = "pass", "fail", "skip"


@dataclass
class ProbeResult:
    name: str  # gemm | copy | allreduce | devices
    status: str  # pass | fail | skip
    value: float | None  # the figure compared with the threshold (None: no figure)
    threshold: float | None
    unit: str
    reason: str
    scope: str = "node"  # node | cluster (an all-reduce across nodes)
    per_gpu: list[float | None] | None = None  # one figure per local GPU, where there are several
    details: dict[str, Any] = field(default_factory=dict)  # sizes, timings, the sweep, device names
    duration_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """value and per_gpu to 6 significant digits (details keep the measurements' full precision)."""
        d = asdict(self)
        d["value"] = _round(self.value)
        d["per_gpu"] = [_round(v) for v in self.per_gpu] if self.per_gpu is not None else None
        return d

    def fail(self, why: str) -> None:
        """Mark failed, keeping the earlier reasons (a figure can fail for several)."""
        self.reason = why if self.status != FAIL else f"{self.reason}; {why}"
        self.status = FAIL


def _round(v: float | None) -> float | None:
    return None if v is None else float(f"{v:.6g}")


def fmt(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.4g}" if abs(v) < 1e6 else f"{v:.3e}"


def evaluate(
    name: str,
    unit: str,
    values: list[float | None],
    threshold: float,
    ratio: float,
    labels: list[str] | None = None,
    errors: list[str | None] | None = None,
) -> ProbeResult:
    """values: one per device (labels name them: 'GPU 3', 'cpu'); errors: why a device has no value."""
    labels = labels or [f"GPU {i}" for i in range(len(values))]
    errors = errors or [None] * len(values)
    per_gpu = list(values) if len(values) > 1 else None
    measured = [v for v in values if v is not None]
    res = ProbeResult(name, PASS, min(measured) if measured else None, threshold, unit, "", per_gpu=per_gpu)
    for label, v, err in zip(labels, values, errors, strict=True):
        if v is None:
            res.fail(f"{label}: no figure ({err or 'not measured'})")
    if res.value is None:
        return res
    worst = labels[values.index(res.value)]
    if res.value < threshold:
        res.fail(f"{worst}: {fmt(res.value)} {unit} < threshold {fmt(threshold)} {unit}")
    if len(measured) >= 2:
        for label, v in zip(labels, values, strict=True):
            others = [o for lab, o in zip(labels, values, strict=True) if lab != label and o is not None]
            if v is None or not others:
                continue
            med = statistics.median(others)
            if v < ratio * med:
                res.fail(
                    f"{label}: {fmt(v)} {unit} < {ratio:g} x {fmt(med)} {unit} "
                    "(the median of this node's other GPUs)"
                )
    if res.status == PASS:
        where = f"min over {len(measured)} GPUs ({worst})" if per_gpu else worst
        res.reason = (
            f"{fmt(res.value)} {unit} >= threshold {fmt(threshold)} {unit}, {where}"
            if threshold > 0
            else f"{fmt(res.value)} {unit}, {where}; threshold 0: recorded, no floor"
        )
    return res
