"""The fault stage's stock torchrun reference runs the trainer as a plain Megatron user would: without
the exit-signal handler (`--no-exit-signal-handler`), so torchrun's SIGTERM to the surviving ranks kills
them at once instead of starting a save-on-signal inside torchrun's 30 s grace. The same reference with
the handler is kept as a second, named figure. Checked on the submitted job specs and on the command
lines the launchers build from them (no training runs here)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from lcm_runner.config import ConfigError, from_dict
from lcm_runner.launch.base import Job, JobSpec, LaunchError
from lcm_runner.launch.commands import agent_argv
from lcm_runner.report import build_report
from lcm_runner.stages import fault
from lcm_runner.stages.common import Progress, StageContext

CFG = {
    "name": "ci-fault",
    "launcher": "torchrun",
    "nodes": 2,
    "procs_per_node": 1,
    "train_iters": 12,
    "save_interval": 4,
    "fault": {"kill_at_step": 6, "kill_node": 1, "cases": ["torchrun_restart_ref"]},
}


class RecordingLauncher:
    """Takes the job specs and refuses to start them: the command lines are what is checked."""

    name = "torchrun"

    def __init__(self) -> None:
        self.specs: list[JobSpec] = []

    def submit(self, spec: JobSpec) -> Job:
        self.specs.append(spec)
        raise LaunchError(f"{spec.name}: not started (recorded)")


def _run(tmp_path: Path, fault_cfg: dict | None = None, **ctx_kw: object) -> tuple[RecordingLauncher, dict]:
    launcher = RecordingLauncher()
    run_dir = tmp_path / "run"
    cfg = from_dict({**CFG, "fault": {**CFG["fault"], **(fault_cfg or {})}})
    ctx = StageContext(cfg, run_dir, launcher, Progress(io.StringIO()), **ctx_kw)  # type: ignore[arg-type]
    fault.run(ctx)
    return launcher, json.loads((run_dir / "stages" / "fault.json").read_text())


def _train_part(argv: list[str]) -> list[str]:
    """What torchrun hands the trainer: everything after `-m lcm_runner.train`."""
    i = argv.index("lcm_runner.train")
    assert argv[i - 1] == "-m"
    return argv[i + 1 :]


def _flags(train: list[str]) -> list[str]:
    """The trainer argv without the per-case checkpoint directories."""
    return [a for i, a in enumerate(train) if not (i and train[i - 1] in ("--save", "--load"))]


def test_torchrun_reference_runs_the_plain_trainer_and_the_handler_figure_is_kept(tmp_path: Path) -> None:
    launcher, res = _run(tmp_path)
    plain, handler = launcher.specs
    assert plain.agent == handler.agent == "torchrun"
    cmd = agent_argv(plain, "0", "127.0.0.1", "ev.jsonl", "logs", "ref-1")
    assert cmd[1:3] == ["-m", "torch.distributed.run"]
    assert "--no-exit-signal-handler" in _train_part(cmd)
    hcmd = agent_argv(handler, "0", "127.0.0.1", "ev.jsonl", "logs", "ref-2")
    assert "--no-exit-signal-handler" not in hcmd
    assert _flags(_train_part(hcmd)) == [
        a for a in _flags(_train_part(cmd)) if a != "--no-exit-signal-handler"
    ]
    m = res["metrics"]
    assert m["torchrun_restart_ref"]["label"] == "stock torchrun, plain trainer (no SIGTERM handler)"
    assert m["torchrun_restart_ref"]["trainer_args"] == ["--no-exit-signal-handler"]
    assert m["torchrun_restart_ref_handler"]["label"] == (
        "stock torchrun, trainer with exit-signal handler (30 s SIGTERM grace)"
    )
    assert m["torchrun_restart_ref_handler"]["trainer_args"] == []
    assert "not started (recorded)" in m["torchrun_restart_ref"]["error"]


def test_handler_figure_can_be_turned_off(tmp_path: Path) -> None:
    launcher, res = _run(tmp_path, torchrun_handler_ref=False)
    assert len(launcher.specs) == 1 and "--no-exit-signal-handler" in launcher.specs[0].train_args
    assert set(res["metrics"]) == {"torchrun_restart_ref"}


def test_the_run_config_turns_the_handler_figure_off(tmp_path: Path) -> None:
    launcher, res = _run(tmp_path, fault_cfg={"torchrun_handler_ref": False})
    assert len(launcher.specs) == 1 and "--no-exit-signal-handler" in launcher.specs[0].train_args
    assert set(res["metrics"]) == {"torchrun_restart_ref"}


def test_the_handler_switch_must_be_a_boolean() -> None:
    with pytest.raises(ConfigError, match="torchrun_handler_ref"):
        from_dict({**CFG, "fault": {**CFG["fault"], "torchrun_handler_ref": "no"}})


def test_report_names_each_torchrun_figure_for_what_it_is(tmp_path: Path) -> None:
    _, res = _run(tmp_path)
    run_dir = tmp_path / "run"
    for name, downtime in (("torchrun_restart_ref", 4.5), ("torchrun_restart_ref_handler", 33.0)):
        res["metrics"][name].update(downtime_s=downtime, error="")
    (run_dir / "stages" / "fault.json").write_text(json.dumps(res))
    build_report(run_dir)
    rows = {r["key"]: r for r in json.loads((run_dir / "slo.json").read_text())["rows"]}
    assert rows["torchrun_restart_plain_s"]["label"] == (
        "Stock torchrun restart, plain trainer (no SIGTERM handler)"
    )
    assert rows["torchrun_restart_plain_s"]["value"] == 4.5
    assert rows["torchrun_restart_handler_s"]["label"] == (
        "Stock torchrun restart, trainer with exit-signal handler (30 s SIGTERM grace)"
    )
    assert rows["torchrun_restart_handler_s"]["value"] == 33.0
    md = (run_dir / "infra_slo.md").read_text()
    assert "| Stock torchrun restart, plain trainer (no SIGTERM handler) | 4.50 s | - | INFO |" in md
    assert (
        "- fault torchrun_restart_ref: Stock torchrun restart, plain trainer (no SIGTERM handler); "
        "extra trainer flags: --no-exit-signal-handler"
    ) in md
    # a run recorded before the plain reference: its torchrun figure ran with the handler, said so
    for name in ("torchrun_restart_ref", "torchrun_restart_ref_handler"):
        res["metrics"][name].pop("trainer_args")
    del res["metrics"]["torchrun_restart_ref_handler"]
    (run_dir / "stages" / "fault.json").write_text(json.dumps(res))
    build_report(run_dir)
    rows = {r["key"]: r for r in json.loads((run_dir / "slo.json").read_text())["rows"]}
    assert rows["torchrun_restart_s"]["label"].startswith("Stock torchrun restart, trainer with exit-signal")
    assert rows["torchrun_restart_s"]["value"] == 4.5
    assert rows["torchrun_restart_handler_s"]["status"] == "SKIP"


def test_a_missing_detection_time_is_said_why_not_printed_as_nan() -> None:
    # a one-node job's node loss has no surviving agent to notice it (H200, 2026-12-02: "detect nans")
    assert fault._detect(fault.Case("node_loss"), 1) == "n/a (no surviving agent)"
    assert fault._detect(fault.Case("floor"), 3) == "n/a (a fresh launch: no fault)"
    assert fault._detect(fault.Case("torchrun_restart_ref"), 3) == "n/a (no agent of ours saw it)"
    assert fault._detect(fault.Case("trainer_kill", detect_s=0.0254), 3) == "0.025s"
    assert "nan" not in fault._detect(fault.Case("trainer_kill"), 3)


def test_the_checkpoint_before_the_kill_comes_from_the_records() -> None:
    """What a recovery must resume from: the last save rank 0 completed before the kill, so a kill that
    lands after the next save (a loaded machine) is checked against that save, not against the plan."""
    from lcm_runner.stages.common import last_save_before
    from lcm_runner.telemetry import Record

    def end(step: int, ts: float, rank: int = 0) -> Record:
        return Record(ts=ts, event="ckpt_end", rank=rank, attempt=0, job="j", data={"step": step})

    recs = [end(4, 1.0), end(4, 1.1, rank=1), end(8, 3.0, rank=1), end(8, 3.2)]
    recs.append(Record(ts=2.5, event="step", rank=0, attempt=0, job="j", data={"step": 12}))
    assert last_save_before(recs, 2.0) == 4.0
    assert last_save_before(recs, 3.1) == 4.0  # rank 1's end alone is not a completed save
    assert last_save_before(recs, 5.0) == 8.0
    assert last_save_before(recs, 0.5) == -1.0
