"""lcm_runner.report over run directories built from records.

The run directories hold what real runs hold: telemetry lines in the trainer's format and stage result
files written by the stages' own StageResult. Numbers are chosen so every status is exercised.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from lcm_runner import config
from lcm_runner.report import build_report, slo
from lcm_runner.stages.common import StageResult

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures" / "nccl"
T0 = 1_790_000_000.0  # 2026-09-21, a fixed clock for the records
PNG = b"\x89PNG\r\n\x1a\n"


def _tel(run: Path, rank: int, job: str, attempt: int, event: str, ts: float, **data: object) -> None:
    d = run / "telemetry"
    d.mkdir(parents=True, exist_ok=True)
    rec = {"ts": ts, "event": event, "rank": rank, "attempt": attempt, "job": job, **data}
    with (d / f"rank{rank}.jsonl").open("a") as fh:
        fh.write(json.dumps(rec, separators=(",", ":")) + "\n")


def _train(run: Path, job: str, steps: range, t_start: float, attempt: int = 0, ranks: int = 4) -> float:
    t = t_start
    for r in range(ranks):
        _tel(run, r, job, attempt, "start", t + 0.01 * r, world_size=ranks, tp=1, pp=1, ep=2, dp=ranks)
    for s in steps:
        t += 0.1
        for r in range(ranks):
            _tel(
                run,
                r,
                job,
                attempt,
                "step",
                t + 0.001 * r,
                step=s,
                loss=5.0 - 0.03 * s,
                step_time_s=0.1,
                tokens_per_s=1000.0,
                comm_time_s=0.02,
            )
        if s % 10 == 0:
            for r in range(ranks):
                _tel(run, r, job, attempt, "ckpt_begin", t + 0.01, step=s, path="/ck")
                _tel(
                    run,
                    r,
                    job,
                    attempt,
                    "ckpt_end",
                    t + 0.5,
                    step=s,
                    blocking_s=0.4,
                    total_s=0.5,
                    bytes=5_000_000,
                    path="/ck",
                )
            t += 0.5
    return t


def _stage(
    run: Path, name: str, verdict: str, metrics: dict, events: list[tuple[float, str]], job_ids: list[str]
) -> None:
    res = StageResult(
        name,
        verdict=verdict,
        summary=f"{name} {verdict.lower()}",
        started=events[0][0] - 1,
        ended=events[-1][0] + 1,
        job_ids=job_ids,
        metrics=metrics,
    )
    for ts, what in events:
        res.event(what, ts)
    res.write(run)


def _case(name: str, downtime: float, jobs: list[str], ratio: float = math.nan, error: str = "") -> dict:
    return {
        "name": name,
        "downtime_s": downtime,
        "detect_s": 0.05,
        "resumed_from_step": 10.0,
        "first_new_step": 11.0,
        "leftover_processes": 0.0,
        "loss_max_rel_diff": 0.0,
        "ratio_to_floor": ratio,
        "completed": not error,
        "job_ids": jobs,
        "error": error,
    }


def full_run(run: Path, comm_fraction: float = 0.2, resume_s: float = 20.0) -> Path:
    t = _train(run, "b-1", range(1, 31), T0)
    _stage(
        run,
        "baseline",
        "PASS",
        {
            "step_time_mean_s": 0.1,
            "step_time_p99_s": 0.12,
            "step_time_cv": 0.05,
            "loss_first": 4.97,
            "loss_last": 4.1,
            "tokens_per_s": 1000.0,
            "comm_fraction": comm_fraction,
            "ckpt_write_s": 0.5,
            "ckpt_blocking_s": 0.4,
            "ckpt_bytes": 2e7,
        },
        [(T0 - 5, "submitted b-1"), (T0 + 0.1, "first step 1"), (t, "job b-1 COMPLETED")],
        ["b-1"],
    )
    # resume: SIGKILL of every rank after step 12, resubmitted, first new step 11
    t1 = _train(run, "r-1", range(1, 13), t + 10)
    t2 = _train(run, "r-2", range(11, 31), t1 + resume_s, attempt=0)
    _stage(
        run,
        "resume",
        "PASS",
        {
            "ckpt_step": 10.0,
            "first_new_step": 11.0,
            "resume_s": resume_s,
            "load_s": 0.3,
            "loss_ref": 4.67,
            "loss_resumed": 4.67,
            "loss_rel_diff": 0.0,
            "kill": {
                "signal": "SIGKILL",
                "at_step": 12.0,
                "ranks_killed": 4.0,
                "world_size": 4.0,
                "left": {},
                "ckpt_before_kill": 10,
                "latest_after_kill": 10,
                "signal_records": 0,
                "ckpt_records_after_kill": 0,
                "complete_dirs_past_ckpt": [],
            },
        },
        [
            (t + 10, "submitted r-1"),
            (t1, "killed r-1 at step 12: SIGKILL of every process of the job at once (node0: 2 rank(s))"),
            (t1 + 1, "resubmitted r-2"),
            (t1 + resume_s + 0.1, "first new step 11"),
        ],
        ["r-1", "r-2"],
    )
    # fault: the floor, the trainer kill (agent restart), stock torchrun, a lost node
    f0 = t2 + 10
    tk_end = _train(run, "f-1", range(1, 16), f0)
    _train(run, "f-1", range(11, 31), tk_end + 3.0, attempt=1)
    nl0 = tk_end + 60
    nl_end = _train(run, "f-2", range(1, 16), nl0)
    _train(run, "f-3", range(11, 31), nl_end + 8.0)
    _stage(
        run,
        "fault",
        "PASS",
        {
            "floor": _case("floor", 2.5, ["f-0"]),
            "trainer_kill": _case("trainer_kill", 3.0, ["f-1"], ratio=1.2),
            "torchrun_restart_ref": {
                **_case("torchrun_restart_ref", 6.0, ["f-9"], ratio=2.4),
                "trainer_args": ["--no-exit-signal-handler"],
            },
            "torchrun_restart_ref_handler": {
                **_case("torchrun_restart_ref_handler", 35.0, ["f-8"], ratio=14.0),
                "trainer_args": [],
            },
            "node_loss": _case("node_loss", 8.0, ["f-2", "f-3"], ratio=3.2),
        },
        [
            (f0 - 3, "floor: fresh launch f-0 from checkpoint 10"),
            (f0 - 0.5, "floor: first new step 11"),
            (tk_end, "trainer_kill: kill -9 trainer on node1 (lcm agent)"),
            (tk_end + 3.0, "trainer_kill: first new step 11"),
            (nl_end, "node_loss: node1 lost (agent + ranks killed)"),
            (nl_end + 8.0, "node_loss: first new step 11"),
        ],
        ["f-0", "f-1", "f-2", "f-3"],
    )
    return run


def test_full_run_report(tmp_path: Path) -> None:
    run = full_run(tmp_path / "run")
    from lcm_runner.nccl import profile_dir

    _stage(
        run,
        "nccl_profile",
        "PASS",
        profile_dir(FIXTURES / "h200x2-tuning"),
        [(T0 + 900, "submitted n-1")],
        ["n-1"],
    )
    cfg = config.load_run_config(ROOT / "configs" / "lab.yml")
    line = build_report(run, cfg)
    assert line.startswith("PASS: 6 SLO(s) met, 0 failed, 0 not measured")
    data = json.loads((run / "slo.json").read_text())
    rows = {r["key"]: r for r in data["rows"]}
    assert rows["comm_fraction"]["value"] == 0.2
    assert rows["comm_fraction"]["target"] == cfg.targets.nccl_fraction_max == 0.8
    assert rows["resume_s"]["status"] == "PASS" and rows["recovery_s"]["value"] == 3.0
    assert rows["recovery_floor_ratio"]["value"] == 1.2 and rows["node_loss_s"]["status"] == "PASS"
    assert rows["step_time_mean_s"]["status"] == "INFO"
    assert data["verdict"] == "PASS" and data["stages"]["fault"]["verdict"] == "PASS"
    md = (run / "infra_slo.md").read_text()
    assert "| NCCL/communication time / step time | 20.0 % | <= 80.0 % | PASS |" in md
    assert "| Fault recovery downtime (trainer kill -9) | 3.00 s | <= 300.00 s | PASS |" in md
    assert "| Resume: submission -> first new step | 20.00 s | <= 120.00 s | PASS |" in md
    assert (
        "after a SIGKILL of every rank (4 of 4) at step 12, nothing saved after it (latest still 10)"
    ) in rows["resume_s"]["note"]
    assert "- resume: first job after a SIGKILL of every rank (4 of 4) at step 12" in md
    assert "| Stock torchrun restart, plain trainer (no SIGTERM handler) | 6.00 s | - | INFO |" in md
    assert (
        "| Stock torchrun restart, trainer with exit-signal handler (30 s SIGTERM grace) | 35.00 s | - "
        "| INFO |"
    ) in md
    assert rows["torchrun_restart_plain_s"]["value"] == 6.0
    assert rows["torchrun_restart_handler_s"]["value"] == 35.0
    assert "P2P/CUMEM" in md and "AllReduce: RING/LL RING/SIMPLE" in md
    for name in ("step_time.png", "loss_per_rank.png", "fault_timeline.png", "slo.png"):
        png = run / "plots" / name
        assert png.read_bytes()[:8] == PNG and png.stat().st_size > 10_000, name
        assert f"![{name}](plots/{name})" in md
    log = (run / "multi_node_run.log").read_text().splitlines()
    body = [ln for ln in log if ln[:4].isdigit()]
    stamps = [ln.split()[0] for ln in body]
    assert stamps == sorted(stamps)  # time-ordered
    assert any("job b-1 attempt 0  step 30 loss 4.1 step_time 100.0 ms comm 20.0 ms" in ln for ln in body)
    assert any("ranks 0-3 checkpoint end step 10: total 0.5s, blocking 0.4s, 5.0 MB" in ln for ln in body)
    assert any("[fault] trainer_kill: kill -9 trainer on node1" in ln for ln in body)
    assert any("job f-1 attempt 1  ranks 0-3 start" in ln for ln in body)
    assert any(ln.startswith("  rank 0 vm:640 NCCL 2.28.9+cuda13.0: 1 communicator init(s)") for ln in log)
    assert not any("step 5 " in ln and "rank 1" in ln for ln in body)  # steps only for rank 0


def test_missing_stages_are_skipped_never_filled(tmp_path: Path) -> None:
    run = tmp_path / "run"
    t = _train(run, "b-1", range(1, 11), T0)
    _stage(
        run,
        "baseline",
        "PASS",
        {
            "step_time_mean_s": 0.1,
            "step_time_p99_s": 0.1,
            "comm_fraction": None,
            "ckpt_write_s": 0.5,
            "ckpt_blocking_s": 0.4,
        },
        [(T0, "submitted b-1"), (t, "done")],
        ["b-1"],
    )
    (run / "plots").mkdir()
    (run / "plots" / "fault_timeline.png").write_bytes(PNG + b"stale")
    line = build_report(run)
    assert line.startswith("PASS: 1 SLO(s) met, 0 failed, 10 not measured")
    rows = {r["key"]: r for r in json.loads((run / "slo.json").read_text())["rows"]}
    assert rows["comm_fraction"] == {
        **rows["comm_fraction"],
        "value": None,
        "status": "SKIP",
        "note": "baseline did not measure it",
    }
    for key in ("resume_s", "recovery_s", "node_loss_s", "recovery_floor_ratio"):
        assert rows[key]["value"] is None and rows[key]["status"] == "SKIP"
    assert rows["resume_s"]["note"] == "stage resume did not run"
    md = (run / "infra_slo.md").read_text()
    assert "| Fault recovery downtime (trainer kill -9) | - | <= 300.00 s | SKIP |" in md
    assert "| fault | SKIP | not run |" in md
    assert not (run / "plots" / "fault_timeline.png").exists()  # the stale plot is removed, not kept
    assert "fault_timeline.png: not drawn: no fault or resume cycle recorded" in md


def test_failed_case_and_failed_target(tmp_path: Path) -> None:
    run = full_run(tmp_path / "run", comm_fraction=0.45)
    fault = json.loads((run / "stages" / "fault.json").read_text())
    fault["metrics"]["node_loss"] = _case("node_loss", math.nan, [], error="no spare node to relaunch on")
    fault["metrics"]["node_loss"]["downtime_s"] = None
    (run / "stages" / "fault.json").write_text(json.dumps(fault))
    line = build_report(run)
    assert line.startswith("FAIL: 4 SLO(s) met, 1 failed, 1 not measured")
    rows = {r["key"]: r for r in json.loads((run / "slo.json").read_text())["rows"]}
    assert rows["comm_fraction"]["status"] == "FAIL"
    assert rows["node_loss_s"]["status"] == "SKIP"
    assert rows["node_loss_s"]["note"] == "case node_loss failed: no spare node to relaunch on"
    r = subprocess.run(
        [sys.executable, "-m", "lcm_runner.report", "--run-dir", str(run)],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert r.returncode == 1 and "report: FAIL" in r.stdout and f"run dir: {run}" in r.stdout


def test_regressions_against_an_earlier_slo_json(tmp_path: Path) -> None:
    before = full_run(tmp_path / "before", resume_s=20.0)
    build_report(before)
    after = full_run(tmp_path / "after", resume_s=30.0)  # +50 % resume time, still under its target
    line = build_report(after, compare=before / "slo.json")
    assert line.startswith("FAIL:") and "1 regression(s)" in line
    data = json.loads((after / "slo.json").read_text())
    assert [(g["key"], g["before"], g["after"]) for g in data["regressions"]] == [("resume_s", 20.0, 30.0)]
    assert data["compared_with"] == str(before / "slo.json")
    md = (after / "infra_slo.md").read_text()
    assert "| Resume: submission -> first new step | 20.0 | 30.0 | +50% (tolerance 20%) |" in md
    same = full_run(tmp_path / "same", resume_s=22.0)  # +10 %: within tolerance
    assert "0 regression(s)" in build_report(same, compare=before / "slo.json")
    failing = full_run(tmp_path / "failing", comm_fraction=0.31)  # 0.2 -> 0.31: passed, fails now
    build_report(failing, compare=before / "slo.json")
    regs = json.loads((failing / "slo.json").read_text())["regressions"]
    assert [(g["key"], g["why"]) for g in regs] == [("comm_fraction", "passed before, fails now")]


def test_rows_use_run_config_targets(tmp_path: Path) -> None:
    run = full_run(tmp_path / "run", resume_s=20.0)
    data = yaml_cfg = config.load_run_config(ROOT / "configs" / "lab.yml")
    yaml_cfg.targets.resume_s_max = 15.0
    build_report(run, data)
    rows = {r["key"]: r for r in json.loads((run / "slo.json").read_text())["rows"]}
    assert rows["resume_s"]["target"] == 15.0 and rows["resume_s"]["status"] == "FAIL"


def test_unreadable_stage_file_and_empty_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "stages").mkdir(parents=True)
    (run / "stages" / "baseline.json").write_text("{not json")
    line = build_report(run)
    assert line.startswith("SKIP: 0 SLO(s) met")
    data = json.loads((run / "slo.json").read_text())
    assert data["problems"][0].startswith("baseline.json: unreadable")
    assert (
        "(no telemetry and no stage results in this run directory)"
        in (run / "multi_node_run.log").read_text()
    )
    with pytest.raises(FileNotFoundError):
        build_report(tmp_path / "nope")


def test_fmt() -> None:
    assert slo.fmt(0.1234, "s") == "123.4 ms" and slo.fmt(12.345, "s") == "12.35 s"
    assert slo.fmt(0.245, "fraction") == "24.5 %" and slo.fmt(1.5, "x") == "1.50x"
    assert slo.fmt(None, "s") == "-" and slo.fmt(math.nan, "s") == "-"
