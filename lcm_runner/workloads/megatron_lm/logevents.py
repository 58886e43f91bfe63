"""The events and counts of the Megatron-LM console-log parser (logparse.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal, TypeAlias

# ---------------------------------------------------------------------------------------------------
# Events


@dataclass(frozen=True)
class Iteration:
    """One "iteration N/ M |" line: the averages over the iterations since the previous logged line.

    `losses` holds every "<name> loss" / "<name>_loss" field as printed ({"lm loss": ...,
    "load_balancing_loss": ...}); `loss` is its "lm loss" (None when not printed). `extra` holds the
    other numeric fields under their printed names (e.g. "throughput per GPU (TFLOP/s/GPU)",
    "num zeros", "params norm", "skipped samples").
    """

    ts: float | None
    iteration: int
    train_iters: int
    consumed_samples: int
    step_time_s: float
    learning_rate: float | None
    global_batch_size: int
    losses: dict[str, float]
    loss: float | None
    loss_scale: float
    grad_norm: float | None
    skipped_iterations: int
    nan_iterations: int
    extra: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class CkptSaveBegin:
    """The line "saving checkpoint at iteration N to PATH in FMT format"."""

    ts: float | None
    iteration: int
    path: str
    fmt: str


@dataclass(frozen=True)
class CkptSaveScheduled:
    """The line "scheduled an async checkpoint save at iteration N to PATH" (async saves only)."""

    ts: float | None
    iteration: int
    path: str


@dataclass(frozen=True)
class CkptSaveEnd:
    """The line "successfully saved checkpoint from iteration N to PATH [ ... ]" (tracker file written).

    `path` is None for Megatron's non-persistent local checkpoints ("successfully saved local
    checkpoint from iteration N" names no directory).
    """

    ts: float | None
    iteration: int
    path: str | None


@dataclass(frozen=True)
class CkptLoadBegin:
    """The line "loading [distributed ]checkpoint from PATH at iteration N"; iteration None: a release."""

    ts: float | None
    iteration: int | None
    path: str


@dataclass(frozen=True)
class CkptLoadEnd:
    """The line "successfully loaded checkpoint from PATH [ ... ] at iteration N"."""

    ts: float | None
    iteration: int
    path: str


@dataclass(frozen=True)
class NoCheckpoint:
    """The line "will not load any checkpoints and will start from random" (no tracker file to load).

    `metadata_file` is the tracker file of the "could not find the metadata file" line before it,
    `path` its directory (both None when that line was not seen).
    """

    ts: float | None
    path: str | None
    metadata_file: str | None = None


ExitReason: TypeAlias = Literal["signal", "iteration", "duration"]


@dataclass(frozen=True)
class ExitRequested:
    """Megatron decided to stop early: after the exit signal (--exit-signal-handler), at
    --exit-interval, or after --exit-duration-in-mins (`minutes`: the train time it printed)."""

    ts: float | None
    reason: ExitReason
    iteration: int | None = None
    minutes: float | None = None


Event: TypeAlias = (
    Iteration
    | CkptSaveBegin
    | CkptSaveScheduled
    | CkptSaveEnd
    | CkptLoadBegin
    | CkptLoadEnd
    | NoCheckpoint
    | ExitRequested
)


@dataclass(frozen=True)
class MalformedLine:
    """A line that is one of the records above but did not parse: where, what, and why."""

    lineno: int
    text: str
    reason: str


@dataclass
class ParseStats:
    """Counts of what a parser saw; `malformed_lines` keeps the first `KEEP` malformed lines."""

    KEEP: ClassVar[int] = 20

    lines: int = 0
    events: int = 0
    ignored: int = 0
    malformed: int = 0
    malformed_lines: list[MalformedLine] = field(default_factory=list)

    def add_malformed(self, item: MalformedLine) -> None:
        self.malformed += 1
        if len(self.malformed_lines) < self.KEEP:
            self.malformed_lines.append(item)
