"""Megatron-LM's console output (`pretrain_gpt.py`, tag core_v0.19.0) read into typed events.

The user's code is not changed: we read what Megatron prints. The formats, from its source:

- `megatron/training/training.py` `training_log` (print_rank_last, so the *last* rank prints it):
  ``" [%Y-%m-%d %H:%M:%S.%f] iteration {:8d}/{:8d} | consumed samples: {:12d} | ... |"``: every field
  is ``" name: value |"``. Always printed: consumed samples, elapsed time per iteration (ms), global
  batch size, loss scale, number of skipped iterations, number of nan iterations. Optional: skipped
  samples, throughput per GPU (TFLOP/s/GPU), energy/power per GPU, learning rate, the losses
  (``"lm loss"``, ``"mtp_1 loss"``, MoE's ``"load_balancing_loss"``, ``"z_loss"``...), other MoE
  scalars, grad norm, num zeros, params norm. The values of a line are averages over the iterations
  since the previous logged line (the first logged line of a run does not reset them, so the second
  line covers the first iteration too). A loss is only printed when its average is ``>= 0``, so Megatron
  never prints ``lm loss: nan``: a non-finite iteration is skipped (its loss is not added) and counted
  in "number of nan iterations"; when every iteration of the interval was skipped the average is over
  none and prints as ``0.000000E+00`` (and grad norm is absent when the optimizer skipped the step).
  An infinite loss would print as ``INF`` (``{:.6E}``), a non-finite grad norm as ``nan``/``inf``.
- `megatron/training/checkpointing.py` (print_rank_0): ``"[ts] saving checkpoint at iteration {:7d} to
  DIR in FORMAT format"``, ``"  [ts] scheduled an async checkpoint save at iteration {:7d} to DIR"``
  (async only), ``"  [ts] successfully saved checkpoint from iteration {:7d} to DIR [ t 1/1, gtp_remat
  1/1, p 1/1 ]"`` (printed by the save's finalisation: later, between iteration lines, for an async
  save), ``" loading [release ][distributed ]checkpoint from DIR at iteration N"`` and ``"  successfully
  loaded checkpoint from DIR [ t 1/1, gtp_remat 1/1, p 1/1 ] at iteration N"`` (no timestamps),
  ``"WARNING: could not find the metadata file FILE"`` + ``"    will not load any checkpoints and will
  start from random"``.
- `training.py` `print_datetime` (print_rank_0): ``"[exiting program after receiving SIGTERM.] datetime:
  TS "`` (whatever --exit-signal is), ``"[exiting program at iteration N] datetime: TS "``,
  ``"[exiting program after M minutes] datetime: TS "``; ``"Exiting during evaluation, timelimit
  reached"`` (a duration exit inside evaluation, no timestamp).

Timestamps are `datetime.now()` of the trainer's host: naive local time, read back with the parsing
host's local time zone (run the parser where the trainer ran, or in the same zone).

A line that is recognisably one of these records but does not parse completely (cut short, a
non-number where a number belongs, a required field missing, a record not at the start of its line)
is *malformed*: counted and kept (the first `ParseStats.KEEP`), never guessed at and never dropped
silently. Every other line (the argument dump, warnings, memory reports) is *ignored*.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from .logevents import (  # noqa: F401 - re-exported
    CkptLoadBegin,
    CkptLoadEnd,
    CkptSaveBegin,
    CkptSaveEnd,
    CkptSaveScheduled,
    Event,
    ExitReason,
    ExitRequested,
    Iteration,
    MalformedLine,
    NoCheckpoint,
    ParseStats,
)
from .logrecords import to_telemetry  # noqa: F401 - re-exported


class _Malformed(ValueError):
    """Raised inside the parser for a recognised record that does not parse; the message is the reason."""


# ---------------------------------------------------------------------------------------------------
# Lexical pieces

_TS = r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.\d{6}"
_TS_FORMAT = "%Y-%m-%d %H:%M:%S.%f"
_TS_TEMPLATE = "[0000-00-00 00:00:00.000000]"  # 0: a digit; a line that is a prefix of it was cut short
_STAMP = re.compile(rf"\[({_TS})\]")
# srun --label ("12: "), then torchrun --tee / PyTorch's rank prefix ("[default0]:", "[rank0]:")
_LAUNCHER_PREFIX = re.compile(r"(?:\s*\d+: )?(?:\[(?:default|rank)\d+\]:)?")
_INT = re.compile(r"\d+")
_NUMBER = re.compile(r"[-+]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf)", re.IGNORECASE)
_RANKS = r"\w+ \d+/\d+(?:, \w+ \d+/\d+)*"

_ITER_START = re.compile(r"iteration +\d+/")  # without a timestamp: at least "iteration N/"
_ITER_HEAD = re.compile(r"iteration +(\d+)/ *(\d+) \|")
_FIELD = re.compile(r"\s*([^:|]*[^:|\s])\s*:\s+(\S+)\s*")
_SAVE_BEGIN = re.compile(r"saving checkpoint at iteration +(\d+) to (.+) in (\S+) format")
_SAVE_SCHEDULED = re.compile(r"scheduled an async checkpoint save at iteration +(\d+) to (.+)")
_SAVE_END = re.compile(rf"successfully saved checkpoint from iteration +(\d+) to (.+?) \[ {_RANKS} \]")
_SAVE_END_LOCAL = re.compile(r"successfully saved local checkpoint from iteration +(\d+)")
_LOAD_START = re.compile(r"loading (?:release )?(?:distributed )?checkpoint\b")
_LOAD_BEGIN = re.compile(r"loading (release )?(?:distributed )?checkpoint from (.+?)(?: at iteration (\d+))?")
_LOAD_END = re.compile(rf"successfully loaded checkpoint from (.+?) \[ {_RANKS} \] at iteration (\d+)")
_EXIT = re.compile(rf"\[exiting program (.*)\] datetime: ({_TS})")
_EXIT_MINUTES = re.compile(r"after ([0-9.eE+-]+) minutes")
_EXIT_ITERATION = re.compile(r"at iteration (\d+)")
_EXIT_EVAL = "Exiting during evaluation, timelimit reached"
_NO_METADATA = re.compile(r"WARNING: could not find the metadata file (.+)")
_NO_CKPT = "will not load any checkpoints and will start from random"
_NO_NONPERSISTENT = "will not load any non-persistent checkpoint"
# one of the records, somewhere other than the start of the line (two writers on one line)
_EMBEDDED = re.compile(
    r"\biteration +\d+/ *\d+ \|"
    r"|\bsaving checkpoint at iteration +\d"
    r"|\bsuccessfully (?:saved|loaded) checkpoint from"
)

# the start of each record's body; a timestamped body that is a proper prefix of one was cut short
_TIMESTAMPED_KEYWORDS = (
    "iteration ",
    "saving checkpoint ",
    "scheduled an async checkpoint save",
    "successfully saved checkpoint",
    "successfully saved local checkpoint",
)

# the fields of an iteration line, by their printed names
_F_CONSUMED = "consumed samples"
_F_ELAPSED = "elapsed time per iteration (ms)"
_F_LR = "learning rate"
_F_GBS = "global batch size"
_F_LOSS_SCALE = "loss scale"
_F_GRAD_NORM = "grad norm"
_F_SKIPPED = "number of skipped iterations"
_F_NAN = "number of nan iterations"
_REQUIRED = (_F_CONSUMED, _F_ELAPSED, _F_GBS, _F_LOSS_SCALE, _F_SKIPPED, _F_NAN)
_KNOWN = frozenset((*_REQUIRED, _F_LR, _F_GRAD_NORM))
LM_LOSS = "lm loss"


def parse_timestamp(text: str) -> float:
    """Unix seconds of a printed "YYYY-MM-DD HH:MM:SS.ffffff", read as this host's local time."""
    try:
        return datetime.strptime(text, _TS_FORMAT).timestamp()
    except ValueError as exc:
        raise _Malformed(f"bad timestamp {text!r}") from exc


def strip_launcher_prefix(line: str) -> str:
    """`line` without its launcher prefix ("3: " of srun --label, "[default0]:"/"[rank0]:" of torchrun)."""
    m = _LAUNCHER_PREFIX.match(line)
    return line[m.end() :] if m else line


def _is_cut_timestamp(text: str) -> bool:
    """True when `text` is a proper prefix of a "[YYYY-MM-DD HH:MM:SS.ffffff]" (at least "[d")."""
    if not 2 <= len(text) < len(_TS_TEMPLATE):
        return False
    for got, want in zip(text, _TS_TEMPLATE, strict=False):
        if (want == "0" and not got.isdigit()) or (want != "0" and got != want):
            return False
    return True


def _number(name: str, text: str) -> float:
    if not _NUMBER.fullmatch(text):
        raise _Malformed(f"{name}: {text!r} is not a number")
    return float(text)


def _integer(name: str, text: str) -> int:
    if not _INT.fullmatch(text):
        raise _Malformed(f"{name}: {text!r} is not an integer")
    return int(text)


def _is_loss(name: str) -> bool:
    return name.endswith((" loss", "_loss"))


# ---------------------------------------------------------------------------------------------------
# Record parsers: a body (the line after its launcher prefix and timestamp) -> an event, or _Malformed


def _iteration_fields(rest: str) -> dict[str, str]:
    """The " name: value |" fields after the "iteration N/ M |" head, values as printed."""
    fields: dict[str, str] = {}
    if not rest.strip():
        return fields
    if not rest.endswith("|"):
        raise _Malformed("cut short: the line does not end with '|'")
    for part in rest[:-1].split("|"):
        m = _FIELD.fullmatch(part)
        if m is None:
            raise _Malformed(f"field {part.strip()!r} is not 'name: value'")
        name, value = m.groups()
        if name in fields:
            raise _Malformed(f"field {name!r} printed twice")
        fields[name] = value
    return fields


def parse_iteration(ts: float | None, body: str) -> Iteration:
    """An `Iteration` from "iteration N/ M | name: value | ... |"; _Malformed unless complete."""
    head = _ITER_HEAD.match(body)
    if head is None:
        raise _Malformed("the head is not 'iteration N/ M |'")
    raw = _iteration_fields(body[head.end() :])
    missing = [name for name in _REQUIRED if name not in raw]
    if missing:
        raise _Malformed(f"missing {', '.join(missing)}")
    values = {name: _number(name, text) for name, text in raw.items()}
    losses = {name: v for name, v in values.items() if _is_loss(name)}
    return Iteration(
        ts=ts,
        iteration=int(head.group(1)),
        train_iters=int(head.group(2)),
        consumed_samples=_integer(_F_CONSUMED, raw[_F_CONSUMED]),
        step_time_s=values[_F_ELAPSED] / 1000.0,
        learning_rate=values.get(_F_LR),
        global_batch_size=_integer(_F_GBS, raw[_F_GBS]),
        losses=losses,
        loss=losses.get(LM_LOSS),
        loss_scale=values[_F_LOSS_SCALE],
        grad_norm=values.get(_F_GRAD_NORM),
        skipped_iterations=_integer(_F_SKIPPED, raw[_F_SKIPPED]),
        nan_iterations=_integer(_F_NAN, raw[_F_NAN]),
        extra={n: v for n, v in values.items() if n not in _KNOWN and n not in losses},
    )


def _full(pattern: re.Pattern[str], body: str, what: str) -> re.Match[str]:
    m = pattern.fullmatch(body)
    if m is None:
        raise _Malformed(f"not a complete {what} line")
    return m


def parse_save_begin(ts: float | None, body: str) -> CkptSaveBegin:
    m = _full(_SAVE_BEGIN, body, "'saving checkpoint at iteration N to PATH in FMT format'")
    return CkptSaveBegin(ts, int(m.group(1)), m.group(2), m.group(3))


def parse_save_scheduled(ts: float | None, body: str) -> CkptSaveScheduled:
    m = _full(_SAVE_SCHEDULED, body, "'scheduled an async checkpoint save at iteration N to PATH'")
    return CkptSaveScheduled(ts, int(m.group(1)), m.group(2))


def parse_save_end(ts: float | None, body: str) -> CkptSaveEnd:
    if body.startswith("successfully saved local checkpoint"):
        m = _full(_SAVE_END_LOCAL, body, "'successfully saved local checkpoint from iteration N'")
        return CkptSaveEnd(ts, int(m.group(1)), None)
    m = _full(_SAVE_END, body, "'successfully saved checkpoint from iteration N to PATH [ ... ]'")
    return CkptSaveEnd(ts, int(m.group(1)), m.group(2))


def parse_load_begin(ts: float | None, body: str) -> CkptLoadBegin:
    m = _full(_LOAD_BEGIN, body, "'loading checkpoint from PATH at iteration N'")
    release, path, iteration = m.groups()
    if release:
        return CkptLoadBegin(ts, None, f"{path} at iteration {iteration}" if iteration else path)
    if iteration is None:
        raise _Malformed("no 'at iteration N'")
    return CkptLoadBegin(ts, int(iteration), path)


def parse_load_end(ts: float | None, body: str) -> CkptLoadEnd:
    m = _full(_LOAD_END, body, "'successfully loaded checkpoint from PATH [ ... ] at iteration N'")
    return CkptLoadEnd(ts, int(m.group(2)), m.group(1))


def parse_exit(body: str) -> ExitRequested:
    """An `ExitRequested` from print_datetime's "[exiting program ...] datetime: TS"."""
    m = _full(_EXIT, body, "'[exiting program ...] datetime: TS'")
    what, ts = m.group(1), parse_timestamp(m.group(2))
    if what == "after receiving SIGTERM.":
        return ExitRequested(ts, "signal")
    if it := _EXIT_ITERATION.fullmatch(what):
        return ExitRequested(ts, "iteration", iteration=int(it.group(1)))
    if mins := _EXIT_MINUTES.fullmatch(what):
        return ExitRequested(ts, "duration", minutes=_number("minutes", mins.group(1)))
    raise _Malformed(f"unknown exit {what!r}")


_TIMESTAMPED_PARSERS: tuple[tuple[str, Callable[[float | None, str], Event]], ...] = (
    ("scheduled an async checkpoint save", parse_save_scheduled),
    ("successfully saved local checkpoint", parse_save_end),
    ("successfully saved checkpoint", parse_save_end),
    ("saving checkpoint ", parse_save_begin),
)


# ---------------------------------------------------------------------------------------------------
# The parser


class MegatronLogParser:
    """Feed it Megatron's console output line by line; it returns the events and keeps `stats`.

    `clock`: when given, an event whose line has no printed timestamp (the checkpoint-load lines, "will
    not load any checkpoints") gets `ts=clock()`, read as its line is fed: use it when feeding live
    output (so a resume's load time can be measured); leave it None for a file read after the fact
    (those events keep ts None).
    """

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self.stats = ParseStats()
        self._clock = clock
        self._metadata_file: str | None = None

    def feed(self, line: str) -> list[Event]:
        """The events of one line (at most one); malformed and ignored lines are counted in `stats`."""
        self.stats.lines += 1
        text = strip_launcher_prefix(line.rstrip("\r\n")).strip()
        try:
            event = self._parse(text)
        except _Malformed as exc:
            self.stats.add_malformed(MalformedLine(self.stats.lines, line.rstrip("\r\n"), str(exc)))
            return []
        if event is None:
            self.stats.ignored += 1
            return []
        self.stats.events += 1
        if event.ts is None and self._clock is not None:
            event = replace(event, ts=self._clock())
        return [event]

    def _parse(self, text: str) -> Event | None:
        stamp = _STAMP.match(text)
        if stamp is not None:
            event = self._parse_timestamped(parse_timestamp(stamp.group(1)), text[stamp.end() :].strip())
        elif _is_cut_timestamp(text):
            raise _Malformed("cut short inside the timestamp")
        else:
            event = self._parse_untimestamped(text)
        if event is None and _EMBEDDED.search(text):
            raise _Malformed("a record that does not start its line")
        return event

    def _parse_timestamped(self, ts: float, body: str) -> Event | None:
        if not body:
            raise _Malformed("a timestamp and nothing after it")
        if body.startswith("iteration "):
            return parse_iteration(ts, body)
        event = self._parse_record(ts, body)
        if event is None and any(k.startswith(body) for k in _TIMESTAMPED_KEYWORDS):
            raise _Malformed(f"cut short after the timestamp: {body!r}")
        return event

    def _parse_record(self, ts: float | None, body: str) -> Event | None:
        """The records Megatron prints with a timestamp (accepted without one too), and the loads."""
        if _ITER_START.match(body):
            return parse_iteration(ts, body)
        for start, parse in _TIMESTAMPED_PARSERS:
            if body.startswith(start):
                return parse(ts, body)
        if _LOAD_START.match(body):
            return parse_load_begin(ts, body)
        if body.startswith("successfully loaded checkpoint"):
            return parse_load_end(ts, body)
        return None

    def _parse_untimestamped(self, text: str) -> Event | None:
        event = self._parse_record(None, text)
        if event is not None:
            return event
        if text.startswith("[exiting program"):
            return parse_exit(text)
        if text == _EXIT_EVAL:
            return ExitRequested(None, "duration")
        return self._parse_missing_checkpoint(text)

    def _parse_missing_checkpoint(self, text: str) -> Event | None:
        """The two-line "could not find the metadata file F" / "will not load any checkpoints" record."""
        if m := _NO_METADATA.fullmatch(text):
            self._metadata_file = m.group(1)
            return None
        if text == _NO_NONPERSISTENT:
            self._metadata_file = None
            return None
        if text == _NO_CKPT:
            metadata, self._metadata_file = self._metadata_file, None
            return NoCheckpoint(None, posixpath.dirname(metadata) if metadata else None, metadata)
        return None


def parse_lines(
    lines: Iterable[str], parser: MegatronLogParser | None = None
) -> tuple[list[Event], ParseStats]:
    """All events of `lines` (with or without their line ends), and the parser's stats."""
    parser = parser or MegatronLogParser()
    events: list[Event] = []
    for line in lines:
        events.extend(parser.feed(line))
    return events, parser.stats


def read_lines(path: str | Path) -> list[str]:
    """The lines of a log, split on "\\n" only (so line numbers are grep's), undecodable bytes replaced."""
    with Path(path).open("rb") as fh:
        return [raw.decode("utf-8", errors="replace") for raw in fh]


def parse_file(path: str | Path) -> tuple[list[Event], ParseStats]:
    """All events of a log file, and the stats (line numbers are the file's, from 1)."""
    return parse_lines(read_lines(path))
