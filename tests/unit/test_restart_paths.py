"""benchmarks/restart_paths.py on the committed calls: each case's recovery figures from its telemetry."""

from __future__ import annotations

import json
from pathlib import Path

from _benchmarks import REPO, load

CALLS = REPO / "docs" / "results" / "h200-restart-paths"
rp = load("restart_paths")


def test_the_recovery_is_the_next_attempts_first_step() -> None:
    # attempt 0 wrote its step-6 record after the kill's timestamp; that is not the recovery
    r = rp.case(CALLS / "restart-5-h100-memory" / "agent_kill")
    assert r["attempt"] == 1 and r["resumed_from"] == 5 and r["same_pid"] is False
    assert r["fault_to_first_step_s"] > r["fault_to_start_s"] > 1.0


def test_in_process_restart_from_host_memory() -> None:
    r = rp.case(CALLS / "restart-5-h100-memory" / "inprocess_fast")
    assert r["same_pid"] is True and r["attempt"] == 1 and r["resumed_from"] == 5
    assert r["resume_verify_s"] == 0.0  # nothing read from disk


def test_summaries_recompute_from_the_telemetry() -> None:
    for call in ("restart-4-h100-before", "restart-5-h100-memory"):
        committed = json.loads((CALLS / call / "summary.json").read_text())
        assert {k: rp.case(CALLS / call / k) for k in committed} == committed, call


def test_a_case_without_a_fault_is_reported(tmp_path: Path) -> None:
    (tmp_path / "x" / "telemetry").mkdir(parents=True)
    assert rp.case(tmp_path / "x") == {"error": "no fault recorded"}
