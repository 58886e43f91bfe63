"""The SLO table of a run: each measurement of the stage results beside its target, PASS/FAIL/SKIP.

Numbers come only from `stages/<stage>.json` (written by the stages from real telemetry). A stage that
did not run, or a measurement it could not make (null/NaN), gives SKIP with the reason, never a number.

Over ~300 lines: one row builder per SLO, each reading its stage's metrics; the table is read as a whole.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lcm_runner.config import Targets

PASS, FAIL, SKIP, INFO = "PASS", "FAIL", "SKIP", "INFO"
STAGES = ("baseline", "resume", "fault", "nccl_profile")
PLAIN_TRAINER_FLAG = "--no-exit-signal-handler"
TORCHRUN_PLAIN = "Stock torchrun restart, plain trainer (no SIGTERM handler)"
TORCHRUN_HANDLER = "Stock torchrun restart, trainer with exit-signal handler (30 s SIGTERM grace)"


@dataclass
class Row:
    key: str
    label: str
    unit: str  # "s" (seconds), "fraction" (shown as %), "x" (a ratio), "rel" (a relative difference)
    value: float | None
    target: float | None  # upper bound (every SLO here is lower-is-better)
    status: str  # PASS | FAIL | SKIP | INFO (no target)
    source: str  # "<stage>.metrics.<key>"
    note: str = ""


@dataclass
class Regression:
    key: str
    label: str
    before: float | None
    after: float | None
    change: float | None  # relative change (after/before - 1)
    why: str


@dataclass
class SloReport:
    run_dir: str
    rows: list[Row]
    stages: dict[str, dict[str, Any]]
    targets: dict[str, float]
    problems: list[str] = field(default_factory=list)  # unreadable stage files, ...
    regressions: list[Regression] = field(default_factory=list)
    baseline_of_comparison: str | None = None
    stops: list[str] = field(default_factory=list)  # how the measured jobs were stopped / run (stop_notes)

    @property
    def verdict(self) -> str:
        """FAIL when a measured SLO fails, a stage failed or a regression was found; PASS otherwise."""
        if any(r.status == FAIL for r in self.rows) or self.regressions:
            return FAIL
        if any(s.get("verdict") == FAIL for s in self.stages.values()):
            return FAIL
        if not any(r.status == PASS for r in self.rows):
            return SKIP
        return PASS

    def to_json(self) -> dict[str, Any]:
        return {
            "run_dir": self.run_dir,
            "verdict": self.verdict,
            "targets": self.targets,
            "rows": [asdict(r) for r in self.rows],
            "stages": {
                k: {"verdict": v.get("verdict", SKIP), "summary": v.get("summary", "")}
                for k, v in self.stages.items()
            },
            "regressions": [asdict(r) for r in self.regressions],
            "compared_with": self.baseline_of_comparison,
            "stops": self.stops,
            "problems": self.problems,
        }


def fmt(value: float | None, unit: str) -> str:
    """A measurement for people: 123.4 ms / 12.34 s, 12.3 %, 1.23x, 1.2e-05."""
    if value is None or not math.isfinite(value):
        return "-"
    if unit == "s":
        return f"{value * 1000:.1f} ms" if abs(value) < 1 else f"{value:.2f} s"
    if unit == "fraction":
        return f"{value * 100:.1f} %"
    if unit == "x":
        return f"{value:.2f}x"
    if unit == "rel":
        return f"{value:.1e}"
    return f"{value:.4g}"


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    v = float(value)
    return v if math.isfinite(v) else None


def load_stages(run_dir: Path) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """stages/*.json of a run; unreadable files are reported, not guessed at."""
    stages: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    d = run_dir / "stages"
    for path in sorted(d.glob("*.json")) if d.is_dir() else []:
        try:
            obj = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            problems.append(f"{path.name}: unreadable ({exc})")
            continue
        if not isinstance(obj, dict) or "verdict" not in obj:
            problems.append(f"{path.name}: not a stage result (no verdict)")
            continue
        stages[str(obj.get("stage") or path.stem)] = obj
    return stages, problems


def _row(
    stages: dict[str, dict[str, Any]],
    stage: str,
    path: tuple[str, ...],
    key: str,
    label: str,
    unit: str,
    target: float | None,
) -> Row:
    source = f"{stage}.metrics." + ".".join(path)
    st = stages.get(stage)
    if st is None:
        return Row(key, label, unit, None, target, SKIP, source, f"stage {stage} did not run")
    value: Any = st.get("metrics", {})
    for p in path:
        value = value.get(p) if isinstance(value, dict) else None
    v = _num(value)
    if v is None:
        why = f"{stage} did not measure it"
        if len(path) == 2 and isinstance(st.get("metrics", {}).get(path[0]), dict):
            err = st["metrics"][path[0]].get("error")
            if err:
                why = f"case {path[0]} failed: {str(err)[:120]}"
        elif len(path) == 2:
            why = f"case {path[0]} did not run"
        return Row(key, label, unit, None, target, SKIP, source, why)
    if target is None:
        return Row(key, label, unit, v, None, INFO, source)
    return Row(key, label, unit, v, target, PASS if v <= target else FAIL, source)


def _fault_case(stages: dict[str, dict[str, Any]], name: str) -> dict[str, Any] | None:
    case = (stages.get("fault") or {}).get("metrics", {}).get(name)
    return case if isinstance(case, dict) else None


def _torchrun_row(stages: dict[str, dict[str, Any]], name: str, plain: bool) -> Row:
    """A stock torchrun reference, keyed and named by how its trainer ran (the case's trainer_args):
    without the exit-signal handler (a plain Megatron user's trainer) or with it. A case recorded
    before the flags were (no trainer_args) ran with the handler: the old key, named for that."""
    case = _fault_case(stages, name)
    if case is not None and "trainer_args" not in case:
        key, label = "torchrun_restart_s", f"{TORCHRUN_HANDLER}, recorded before the plain reference"
    else:
        if case is not None:
            plain = PLAIN_TRAINER_FLAG in (case.get("trainer_args") or [])
        key = "torchrun_restart_plain_s" if plain else "torchrun_restart_handler_s"
        label = TORCHRUN_PLAIN if plain else TORCHRUN_HANDLER
    return _row(stages, "fault", (name, "downtime_s"), key, label, "s", None)


def resume_kill_note(stages: dict[str, dict[str, Any]]) -> str:
    """How the resume stage stopped its first job, from its result (empty when the stage did not run)."""
    st = stages.get("resume")
    if not st:
        return ""
    k = st.get("metrics", {}).get("kill")
    if not isinstance(k, dict):
        return "stopped by a cancel (a run from before the SIGKILL resume: ranks could checkpoint on SIGTERM)"
    ranks, world = _num(k.get("ranks_killed")), _num(k.get("world_size"))
    every = ranks is not None and ranks == world and not k.get("left")
    who = "every rank" if every else "some ranks"
    saved = k.get("ckpt_records_after_kill") or k.get("complete_dirs_past_ckpt") or k.get("signal_records")
    after = (
        f"signal records {k.get('signal_records')}, checkpoint records after the kill "
        f"{k.get('ckpt_records_after_kill')}, complete iter dirs past {k.get('ckpt_before_kill')}: "
        f"{k.get('complete_dirs_past_ckpt')}"
        if saved
        else f"nothing saved after it (latest still {k.get('latest_after_kill')})"
    )
    return (
        f"after a {k.get('signal', '?')} of {who} ({fmt(ranks, '')} of {fmt(world, '')}) at step "
        f"{fmt(_num(k.get('at_step')), '')}, {after}"
    )


def stop_notes(stages: dict[str, dict[str, Any]]) -> list[str]:
    """How each job the report measures was stopped or run, for people: the resume stage's kill and the
    trainer flags of the stock torchrun references."""
    out = []
    if note := resume_kill_note(stages):
        out.append(f"resume: first job {note}")
    for name in ("torchrun_restart_ref", "torchrun_restart_ref_handler"):
        case = _fault_case(stages, name)
        if case is None:
            continue
        row = _torchrun_row(stages, name, plain=name == "torchrun_restart_ref")
        flags = " ".join(case.get("trainer_args") or []) or (
            "none" if "trainer_args" in case else "not recorded"
        )
        out.append(f"fault {name}: {row.label}; extra trainer flags: {flags}")
    return out


def container_note(records: list[Any]) -> str:
    """Where the ranks ran, from their start events' `rootfs` (procutil.root_mount): inside an Enroot
    container (Pyxis) or on the nodes; "" when none recorded it."""
    roots = [str(r.get("rootfs")) for r in records if r.event == "start" and r.get("rootfs") is not None]
    if not roots:
        return ""
    from lcm_runner.train.procutil import in_enroot_container

    inside = sum(1 for root in roots if in_enroot_container(root))
    jobs = {
        str(r.job) for r in records if r.event == "start" and in_enroot_container(str(r.get("rootfs", "")))
    }
    if inside == len(roots):
        return f"containers: all {inside} rank starts ran inside Pyxis containers ({len(jobs)} job(s))"
    if inside == 0:
        return f"containers: none; all {len(roots)} rank starts ran on the nodes' own root filesystem"
    return (
        f"containers: {inside} of {len(roots)} rank starts ran inside Pyxis containers, the rest on the nodes"
    )


def build_rows(stages: dict[str, dict[str, Any]], t: Targets) -> list[Row]:
    rows = _rows(stages, t)
    note = resume_kill_note(stages)
    comm = comm_note(stages)
    for r in rows:
        if r.key == "resume_s" and note and r.value is not None:
            r.note = note
        if r.key == "comm_fraction" and comm and r.value is not None:
            r.note = comm
    return rows


def comm_note(stages: dict[str, dict[str, Any]], top: int = 4) -> str:
    """The largest collectives of the baseline's communication share: `fwd-bwd:pp.batch_isend_irecv 26 %`."""
    metrics = (stages.get("baseline") or {}).get("metrics", {})
    shares = [
        (k.removeprefix("comm_fraction."), v)
        for k, v in metrics.items()
        if k.startswith("comm_fraction.") and isinstance(v, int | float)
    ]
    shares.sort(key=lambda kv: -kv[1])
    return ", ".join(f"{name} {share * 100:.1f} %" for name, share in shares[:top])


def _rows(stages: dict[str, dict[str, Any]], t: Targets) -> list[Row]:
    s = stages
    return [
        _row(s, "baseline", ("step_time_mean_s",), "step_time_mean_s", "Per-step time, mean", "s", None),
        _row(s, "baseline", ("step_time_p99_s",), "step_time_p99_s", "Per-step time, p99", "s", None),
        _row(
            s,
            "baseline",
            ("comm_fraction",),
            "comm_fraction",
            "NCCL/communication time / step time",
            "fraction",
            t.nccl_fraction_max,
        ),
        _row(
            s, "baseline", ("ckpt_write_s",), "ckpt_write_s", "Checkpoint write time", "s", t.ckpt_write_s_max
        ),
        _row(
            s,
            "baseline",
            ("ckpt_blocking_s",),
            "ckpt_blocking_s",
            "Checkpoint time blocking training",
            "s",
            None,
        ),
        _row(
            s,
            "resume",
            ("resume_s",),
            "resume_s",
            "Resume: submission -> first new step",
            "s",
            t.resume_s_max,
        ),
        _row(
            s,
            "resume",
            ("loss_rel_diff",),
            "resume_loss_rel_diff",
            "Resume: loss vs uninterrupted run (rel.)",
            "rel",
            None,
        ),
        _row(
            s,
            "fault",
            ("trainer_kill", "downtime_s"),
            "recovery_s",
            "Fault recovery downtime (trainer kill -9)",
            "s",
            t.recovery_s_max,
        ),
        _row(
            s,
            "fault",
            ("trainer_kill", "ratio_to_floor"),
            "recovery_floor_ratio",
            "Fault recovery / fresh-launch floor",
            "x",
            t.recovery_floor_ratio_max,
        ),
        _row(
            s,
            "fault",
            ("node_loss", "downtime_s"),
            "node_loss_s",
            "Node loss: kill -> first new step",
            "s",
            t.node_loss_s_max,
        ),
        _torchrun_row(s, "torchrun_restart_ref", plain=True),
        _torchrun_row(s, "torchrun_restart_ref_handler", plain=False),
        _row(
            s, "fault", ("floor", "downtime_s"), "floor_s", "Floor: fresh launch from checkpoint", "s", None
        ),
        _row(
            s,
            "fault",
            ("trainer_kill", "loss_max_rel_diff"),
            "recovery_loss_rel_diff",
            "Fault recovery: max loss diff vs uninterrupted (rel.)",
            "rel",
            None,
        ),
    ]


def compare(rows: list[Row], earlier: dict[str, Any], tolerance: float) -> list[Regression]:
    """Regressions against an earlier slo.json: a lower-is-better number that grew by more than
    `tolerance` (relative), or a row that passed then and fails now."""
    before = {r.get("key"): r for r in earlier.get("rows", []) if isinstance(r, dict)}
    out: list[Regression] = []
    for row in rows:
        old = before.get(row.key)
        if old is None:
            continue
        ov, nv = _num(old.get("value")), row.value
        if old.get("status") == PASS and row.status == FAIL:
            out.append(Regression(row.key, row.label, ov, nv, _rel(ov, nv), "passed before, fails now"))
            continue
        if ov is None or nv is None or row.key.endswith("loss_rel_diff"):
            continue
        change = _rel(ov, nv)
        if change is not None and change > tolerance:
            out.append(
                Regression(row.key, row.label, ov, nv, change, f"+{change:.0%} (tolerance {tolerance:.0%})")
            )
    return out


def _rel(old: float | None, new: float | None) -> float | None:
    if old is None or new is None or old <= 0:
        return None
    return new / old - 1.0


def build(
    run_dir: Path, targets: Targets, earlier: dict[str, Any] | None = None, earlier_name: str | None = None
) -> SloReport:
    stages, problems = load_stages(run_dir)
    rows = build_rows(stages, targets)
    rep = SloReport(str(run_dir), rows, stages, asdict(targets), problems, stops=stop_notes(stages))
    if earlier is not None:
        rep.regressions = compare(rows, earlier, targets.regression_rel_max)
        rep.baseline_of_comparison = earlier_name
    return rep
