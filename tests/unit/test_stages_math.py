"""Stage measurements and verdicts from telemetry records (the numbers the report prints)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from lcm_runner.launch.base import JobState
from lcm_runner.launch.slurm import parse_scontrol, state_of
from lcm_runner.stages.baseline import measure
from lcm_runner.stages.common import StageResult, losses_by_step, max_rel_diff, p99
from lcm_runner.telemetry import Record


def rec(event: str, ts: float, rank: int = 0, attempt: int = 0, **data: object) -> Record:
    return Record(ts, event, rank, attempt, "j1", dict(data))


def test_measure_baseline_metrics() -> None:
    recs = []
    for s in range(1, 11):
        for r in (0, 1):
            recs.append(
                rec(
                    "step",
                    100 + s + r * 0.01,
                    r,
                    step=s,
                    loss=5.0 - 0.1 * s,
                    step_time_s=0.1 if s > 1 else 1.0,
                    tokens_per_s=1000.0,
                    comm_time_s=0.02,
                )
            )
    recs += [rec("ckpt_end", 200, r, step=10, total_s=2.0, blocking_s=1.5, bytes=100) for r in (0, 1)]
    m = measure(recs, 10)
    assert m["steps"] == 10
    assert math.isclose(m["step_time_mean_s"], 0.1)  # step 1 (warm-up) excluded
    assert m["step_time_cv"] < 1e-9
    assert math.isclose(m["loss_first"], 4.9) and math.isclose(m["loss_last"], 4.0)
    assert m["loss_slope"] < 0
    assert math.isclose(m["comm_fraction"], 0.2)
    assert m["ckpt_write_s"] == 2.0 and m["ckpt_blocking_s"] == 1.5
    assert m["ckpt_bytes"] == 200  # both ranks' shards of the step


def test_losses_by_step_last_record_wins_and_filters() -> None:
    recs = [
        rec("step", 1, step=5, loss=3.0),
        rec("step", 2, attempt=1, step=5, loss=2.5),
        rec("step", 3, 1, step=5, loss=9.0),
    ]
    assert losses_by_step(recs) == {5: 2.5}  # rank 0 only; the re-run step replaces the killed one
    assert losses_by_step(recs, after_ts=1.5) == {5: 2.5}
    assert losses_by_step(recs, attempt_min=2) == {}


def test_max_rel_diff_and_p99() -> None:
    d, n = max_rel_diff({1: 1.0, 2: 2.2, 3: 7.0}, {1: 1.0, 2: 2.0})
    assert n == 2 and math.isclose(d, 0.1)
    assert math.isnan(max_rel_diff({1: 1.0}, {2: 1.0})[0])
    assert p99([float(x) for x in range(1, 101)]) == 99.0


def test_stage_result_decide_and_write(tmp_path: Path) -> None:
    r = StageResult("fault")
    r.checks = {"a": True, "b": False}
    r.metrics = {"x": math.nan, "case": {"downtime_s": math.inf}}
    r.decide("numbers")
    assert r.verdict == "FAIL" and r.summary == "numbers; failed: b"
    path = r.write(tmp_path)
    data = json.loads(path.read_text())
    assert path == tmp_path / "stages" / "fault.json"
    assert data["metrics"] == {"x": None, "case": {"downtime_s": None}}  # JSON has no NaN
    assert set(data) >= {"stage", "verdict", "summary", "started", "ended", "job_ids", "metrics", "events"}
    empty = StageResult("x")
    empty.decide("nothing checked")
    assert empty.verdict == "FAIL"  # no check at all is not a pass


def test_scontrol_job_line_parsing() -> None:
    line = (
        "JobId=42 JobName=lcm-baseline UserId=root(0) JobState=RUNNING Reason=None Dependency=(null) "
        "Requeue=1 Restarts=1 BatchFlag=1 ExitCode=0:0 NodeList=lab-node[1-2] BatchHost=lab-node1"
    )
    f = parse_scontrol(line)
    assert f["JobState"] == "RUNNING" and f["Restarts"] == "1" and f["NodeList"] == "lab-node[1-2]"
    assert state_of(f).state == JobState.RUNNING
    assert state_of({**f, "JobState": "NODE_FAIL"}).state == JobState.FAILED
    assert state_of({**f, "JobState": "REQUEUED"}).state == JobState.PENDING
    done = state_of({**f, "JobState": "FAILED", "ExitCode": "76:0"})
    assert done.state == JobState.FAILED and done.exit_codes == {"batch": 76}


def test_measure_baseline_communication_per_collective_and_the_report_note() -> None:
    from lcm_runner.report.slo import comm_note

    recs = [
        rec("step", 100 + s, 0, step=s, loss=1.0, step_time_s=0.2, tokens_per_s=1.0, comm_time_s=0.08,
            comm={"fwd-bwd:pp.batch_isend_irecv": 0.05, "fwd-bwd:ep.all_to_all_single": 0.02 + 0.01 * (s % 2),
                  "grad:dp.all_reduce": 0.01 - 0.01 * (s % 2)})
        for s in range(1, 7)
    ]  # fmt: skip
    m = measure(recs, 6)
    assert math.isclose(m["comm_fraction"], 0.4)
    assert math.isclose(m["comm_fraction.fwd-bwd:pp.batch_isend_irecv"], 0.25)
    assert math.isclose(m["comm_fraction.fwd-bwd:ep.all_to_all_single"], 0.12)  # steps 2-6 (1: warm-up)
    assert math.isclose(m["comm_fraction.grad:dp.all_reduce"], 0.03)
    note = comm_note({"baseline": {"metrics": m}}, top=2)
    assert note == "fwd-bwd:pp.batch_isend_irecv 25.0 %, fwd-bwd:ep.all_to_all_single 12.0 %"
    assert comm_note({"baseline": {"metrics": {"comm_fraction": 0.1}}}) == ""
