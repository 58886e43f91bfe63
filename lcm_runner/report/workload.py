"""The report's workload section: what the stages trained (the project's trainer or the user's
Megatron-LM), which of the user's arguments the runner added or overrode, and how well the user's own
console log parsed (the bridge's `log_parse` records: every line that looked like a Megatron-LM record
but did not parse is counted and sampled, never dropped silently)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lcm_runner.config import RunConfig
from lcm_runner.contracts import EVENT_LOG_PARSE
from lcm_runner.telemetry import Record

MALFORMED_SHOWN = 10


@dataclass
class WorkloadSection:
    kind: str
    script: str | None = None
    user_args: list[str] = field(default_factory=list)
    arg_changes: list[str] = field(default_factory=list)
    loss_rel_tol: float | None = None
    step_rank: str = "rank 0"
    ranks_parsed: int = 0  # log_parse records (one per rank start that ended)
    lines: int = 0
    events: int = 0
    malformed: int = 0
    malformed_lines: list[str] = field(default_factory=list)


def section(cfg: RunConfig | None, records: list[Record]) -> WorkloadSection | None:
    """None for the project's own trainer with no log_parse records (nothing to say)."""
    parses = [r for r in records if r.event == EVENT_LOG_PARSE]
    if cfg is None and not parses:
        return None
    w = cfg.workload if cfg is not None else None
    if w is not None and not w.foreign and not parses:
        return None
    out = WorkloadSection(kind=w.kind if w is not None else "megatron-lm")
    if w is not None and cfg is not None:
        from lcm_runner.config.argv import megatron_arg_changes

        out.script = w.script
        out.user_args = list(w.args)
        out.arg_changes = megatron_arg_changes(cfg)
        out.loss_rel_tol = w.resume_loss_rel_tol
        out.step_rank = "the last rank (Megatron-LM prints its iteration line there)"
    out.ranks_parsed = len(parses)
    for r in parses:
        out.lines += int(r.get("lines") or 0)
        out.events += int(r.get("events") or 0)
        out.malformed += int(r.get("malformed") or 0)
        for line in r.get("malformed_lines") or []:
            if len(out.malformed_lines) < MALFORMED_SHOWN:
                out.malformed_lines.append(f"job {r.job} rank {r.rank} line {line}")
    return out


def as_dict(sec: WorkloadSection | None) -> dict[str, Any] | None:
    from dataclasses import asdict

    return asdict(sec) if sec is not None else None
