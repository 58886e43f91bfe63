"""Control-plane faults on the lab's real Slurm: slurmctld restarted mid-job, and a
compute node's slurmd SIGKILLed and started again mid-job. Training must go on (or requeue from the last
checkpoint); no step may be lost beyond the last checkpoint.

Needs the lab up with two compute nodes or more (it reuses the job harness of
tests/faults/test_node_faults.py): LCM_LAB=1 pytest -m lab tests/faults/test_control_plane.py -s.
molecule verify runs it (the lab's CI subset of the matrix).
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest
from faultmatrix import Matrix, Row
from labnodes import Case, lab_nodes
from labnodes import ctl as _ctl
from labnodes import node_state as _node_state
from labnodes import run as _run
from labnodes import wait as _wait

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def lab() -> list[str]:
    """The lab with at least two compute nodes (no spare needed: nothing here moves the job)."""
    return lab_nodes(2)


def _running_nodes(case: Case) -> list[str]:
    running = _wait(case.nodes, 240, 0.5, f"job {case.job} running")
    assert len(running) == 2, running
    return running


MAX_GAP_S = 30.0  # the longest pause between two training steps a control-plane fault may cause


def _steps_after(case: Case, t0: float) -> list[dict[str, Any]]:
    return [r for r in case.telemetry() if r["event"] == "step" and r["ts"] > t0]


def _gap_around(case: Case, t0: float) -> float:
    """The longest time between consecutive step records from the last step before t0 on."""
    st = sorted((r for r in case.telemetry() if r["event"] == "step"), key=lambda r: r["ts"])
    before = [r for r in st if r["ts"] <= t0]
    seq = ([before[-1]] if before else []) + [r for r in st if r["ts"] > t0]
    return max((b["ts"] - a["ts"] for a, b in itertools.pairwise(seq)), default=0.0)


def _outcome(case: Case, t0: float) -> dict[str, Any]:
    recs = case.telemetry()
    resumes = [r for r in recs if r["event"] == "resume" and r["ts"] > t0]
    requeued = any(r["restarts"] >= 1 for r in case.polled() if r["ts"] > t0)
    out: dict[str, Any] = {"requeued": requeued, "gap_s": round(_gap_around(case, t0), 2)}
    if resumes:
        out["resumed_from"] = resumes[0]["step"]
        out["last_ckpt"] = case.last_ckpt_before(t0)
        first = [r for r in recs if r["event"] == "step" and r["ts"] > resumes[0]["ts"]]
        out["first_new_step"] = first[0]["step"] if first else None
        out["downtime_s"] = round(first[0]["ts"] - t0, 2) if first else None
    return out


@pytest.mark.lab
def test_slurmctld_restart_mid_job_training_goes_on(
    lab: list[str],
    matrix: Matrix,
    request: pytest.FixtureRequest,
) -> None:
    case = Case("ctld-restart")
    try:
        case.submit()
        _running_nodes(case)
        case.wait_mid_run()
        t0 = time.time()
        p = _ctl("systemctl", "restart", "slurmctld", timeout=120)
        assert p.returncode == 0, p.stderr
        _wait(lambda: _ctl("scontrol", "ping").returncode == 0, 60, 0.5, "slurmctld to answer again")
        back_s = time.time() - t0
        _wait(lambda: len(_steps_after(case, t0)) >= 3, 120, 0.5, "three steps after the restart")
        case.wait_done()
        o = _outcome(case, t0)
        case.metrics.update(o, ctld_back_s=round(back_s, 2))
        assert not o["requeued"] and "resumed_from" not in o, o  # the job went on, nothing restarted
        assert o["gap_s"] <= MAX_GAP_S, o
        matrix.record(
            Row(
                fault="slurmctld restarted mid-job",
                injected="systemctl restart slurmctld on lab-ctl after the first checkpoint",
                detected_s=None,
                recovered=True,
                downtime_s=o["gap_s"],
                steps_lost=0,
                good_ckpts_lost=0,
                notes=f"no requeue, no restart of the ranks; slurmctld answered after {back_s:.1f} s; "
                f"longest pause between steps {o['gap_s']:.2f} s; job COMPLETED",
            ),
            request,
        )
    finally:
        case.close()


@pytest.mark.lab
def test_slurmd_killed_and_restarted_mid_job_loses_nothing(
    lab: list[str],
    matrix: Matrix,
    request: pytest.FixtureRequest,
) -> None:
    case = Case("slurmd-kill")
    victim = ""
    try:
        case.submit()
        victim = _running_nodes(case)[1]
        case.wait_mid_run()
        t0 = time.time()
        p = _run(["podman", "exec", victim, "pkill", "-KILL", "-x", "slurmd"])
        assert p.returncode == 0, p.stderr
        time.sleep(5)  # slurmd gone for a while (well inside SlurmdTimeout)
        p = _run(["podman", "exec", victim, "systemctl", "restart", "slurmd"], timeout=120)
        assert p.returncode == 0, p.stderr
        restarted_s = time.time() - t0
        _wait(lambda: _node_state(victim)[0] in ("allocated", "mixed", "idle"), 90, 0.5, f"{victim} back")
        case.wait_done()
        o = _outcome(case, t0)
        case.metrics.update(o, slurmd_restarted_s=round(restarted_s, 2))
        if "resumed_from" in o:  # requeued: it must resume from the last checkpoint
            assert o["first_new_step"] == o["last_ckpt"] + 1 == o["resumed_from"] + 1, o
        else:
            assert o["gap_s"] <= MAX_GAP_S, o
        state, _ = _node_state(victim)
        assert not state.startswith(("down", "drain")), state
        how = (
            f"requeued, resumed from {o['resumed_from']}"
            if "resumed_from" in o
            else "the job step survived (slurmstepd kept running)"
        )
        matrix.record(
            Row(
                fault="slurmd SIGKILLed and restarted on a compute node mid-job",
                injected=f"pkill -KILL slurmd on {victim}, systemctl restart slurmd 5 s later",
                detected_s=None,
                recovered=True,
                downtime_s=o.get("downtime_s", o["gap_s"]),
                steps_lost=0,
                good_ckpts_lost=0,
                notes=f"{how}; longest pause between steps {o['gap_s']:.2f} s; node {state}; job COMPLETED",
            ),
            request,
        )
        victim = ""
    finally:
        case.close()
        if victim:
            _run(["podman", "exec", victim, "systemctl", "start", "slurmd"])
