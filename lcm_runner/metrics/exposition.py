"""Metric families -> the Prometheus text exposition format (0.0.4), and the atomic file write that
node_exporter's textfile collector needs.

The textfile collector reads every `*.prom` file of its directory at each scrape and rejects a whole
file that it cannot parse, that repeats a series, or whose samples carry timestamps; so a family is
rendered once with all its samples, series are checked for duplicates here, and no timestamp is ever
written. A reader must never see half a file: `write_atomic` writes `<name>.<pid>.tmp` (not `*.prom`,
so the collector ignores it) in the same directory and renames it over the target.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

MetricType = Literal["gauge", "counter", "histogram", "untyped"]

_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def format_value(value: float) -> str:
    """A sample value as Prometheus writes it: NaN, +Inf, -Inf, integers without a fraction, floats
    with the shortest representation that reads back to the same float (Go's ParseFloat accepts it)."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    v = float(value)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(v)


def format_bound(bound: float) -> str:
    """A histogram bucket's `le` value, always as a float (0.05, 1.0, +Inf): every writer of the same
    histogram must spell a bound the same way, or `le="1"` and `le="1.0"` become two series."""
    return format_value(float(bound))


def escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


Labels = Mapping[str, str]


@dataclass(frozen=True)
class Sample:
    """One series of a gauge/counter family: its labels and value."""

    labels: Labels
    value: float


@dataclass
class Histogram:
    """One series of a histogram family: fixed upper bounds (without +Inf), observations counted per
    bucket (not cumulative: the rendering accumulates), their sum and count."""

    labels: Labels
    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)  # len(bounds) + 1: the last one is +Inf
    sum: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        if list(self.bounds) != sorted(set(self.bounds)) or any(math.isinf(b) for b in self.bounds):
            raise ValueError(f"histogram bounds must be finite and strictly increasing: {self.bounds}")
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)
        if len(self.counts) != len(self.bounds) + 1:
            raise ValueError("a histogram needs one count per bound plus the +Inf bucket")

    def observe(self, value: float) -> None:
        i = len(self.bounds)
        for j, b in enumerate(self.bounds):
            if value <= b:
                i = j
                break
        self.counts[i] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """(le, cumulative count) per bucket, +Inf last (equal to count)."""
        out: list[tuple[str, int]] = []
        running = 0
        for b, c in zip((*self.bounds, math.inf), self.counts, strict=True):
            running += c
            out.append((format_bound(b), running))
        return out


@dataclass
class MetricFamily:
    name: str
    type: MetricType
    help: str
    samples: list[Sample | Histogram] = field(default_factory=list)

    def add(self, value: float, **labels: object) -> None:
        self.samples.append(Sample(_str_labels(labels), value))


def _str_labels(labels: Mapping[str, object]) -> dict[str, str]:
    return {k: str(v) for k, v in labels.items() if v is not None}


def _label_text(labels: Iterable[tuple[str, str]]) -> str:
    items = list(labels)
    if not items:
        return ""
    return "{" + ",".join(f'{k}="{escape_label_value(v)}"' for k, v in items) + "}"


def _check_labels(family: str, labels: Labels, reserved: Sequence[str]) -> None:
    for k in labels:
        if not _LABEL_NAME.match(k) or k.startswith("__"):
            raise ValueError(f"{family}: invalid label name {k!r}")
        if k in reserved:
            raise ValueError(f"{family}: label {k!r} is reserved for this metric type")


def render_family(family: MetricFamily) -> str:
    if not _METRIC_NAME.match(family.name):
        raise ValueError(f"invalid metric name {family.name!r}")
    lines = [f"# HELP {family.name} {escape_help(family.help)}", f"# TYPE {family.name} {family.type}"]
    seen: set[tuple[tuple[str, str], ...]] = set()
    for s in family.samples:
        key = tuple(sorted(s.labels.items()))
        if key in seen:
            raise ValueError(f"{family.name}: duplicate series {dict(key)}")
        seen.add(key)
        if isinstance(s, Histogram):
            if family.type != "histogram":
                raise ValueError(f"{family.name}: a histogram series in a {family.type} family")
            _check_labels(family.name, s.labels, ("le",))
            base = list(s.labels.items())
            for le, n in s.cumulative():
                lines.append(f"{family.name}_bucket{_label_text([*base, ('le', le)])} {n}")
            lines.append(f"{family.name}_sum{_label_text(base)} {format_value(s.sum)}")
            lines.append(f"{family.name}_count{_label_text(base)} {s.count}")
        else:
            if family.type == "histogram":
                raise ValueError(f"{family.name}: a plain sample in a histogram family")
            _check_labels(family.name, s.labels, ())
            lines.append(f"{family.name}{_label_text(s.labels.items())} {format_value(s.value)}")
    return "\n".join(lines) + "\n"


def render(families: Iterable[MetricFamily]) -> str:
    """The exposition text of `families`, in order; families without samples are left out (a HELP and
    TYPE line alone is valid, but says nothing). Raises ValueError for a repeated family name."""
    names: set[str] = set()
    parts: list[str] = []
    for f in families:
        if f.name in names:
            raise ValueError(f"metric family {f.name!r} rendered twice")
        names.add(f.name)
        if f.samples:
            parts.append(render_family(f))
    return "".join(parts)


def tmp_path_for(path: Path) -> Path:
    return path.with_name(f"{path.name}.{os.getpid()}.tmp")


def write_atomic(path: str | Path, text: str, mode: int = 0o644) -> None:
    """Replace `path` with `text` so that a reader sees the old file or the new one, never a part:
    write `<name>.<pid>.tmp` in the same directory, fsync it, rename it over `path`, fsync the
    directory. The mode is set explicitly (node_exporter runs as another user; a job's umask of 077
    would hide the file from it). The temporary file is removed when anything fails."""
    path = Path(path)
    tmp = tmp_path_for(path)
    data = text.encode("utf-8")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
