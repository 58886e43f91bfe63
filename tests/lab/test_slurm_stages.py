"""`lcm-runner all --launcher slurm` on the podman lab's controller (real Slurm, two CPU nodes, gloo).

Run from the host: `pytest -m lab tests/lab` (molecule verify runs it). The run itself is the session
fixture `lab_run_result` (tests/conftest.py, tests/support/labrun.py), shared with the monitoring tests.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from labrun import LabRun

from lcm_runner.telemetry import load_run, of_event
from lcm_runner.train.procutil import in_enroot_container

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def lab_run(lab_run_result: LabRun) -> Path:
    return lab_run_result.dir


def _stage(run_dir: Path, name: str) -> dict:
    return json.loads((run_dir / "stages" / f"{name}.json").read_text())


def test_rendered_files_and_report(lab_run: Path) -> None:
    for f in ("train_2node.sbatch", "nccl_env.sh", "infra_slo.md", "slo.json", "multi_node_run.log"):
        assert (lab_run / f).is_file(), f
    assert list((lab_run / "plots").glob("*.png"))


def test_baseline_and_resume_pass_on_slurm(lab_run: Path) -> None:
    base = _stage(lab_run, "baseline")
    assert base["verdict"] == "PASS", base["summary"]
    assert all(j.isdigit() for j in base["job_ids"])  # Slurm job ids
    res = _stage(lab_run, "resume")
    assert res["verdict"] == "PASS", res["summary"]
    assert res["metrics"]["first_new_step"] == res["metrics"]["ckpt_step"] + 1


def test_fault_recovery_on_slurm(lab_run: Path) -> None:
    fault = _stage(lab_run, "fault")
    m = fault["metrics"]
    assert {"floor", "trainer_kill", "torchrun_restart_ref", "node_loss"} <= set(m)
    for case in ("floor", "trainer_kill", "node_loss"):
        assert m[case]["leftover_processes"] == 0, case
    assert m["trainer_kill"]["ratio_to_floor"] <= 1.5
    assert m["node_loss"]["downtime_s"] <= 60
    assert fault["verdict"] == "PASS", fault["summary"]


def test_nccl_profile_is_skipped_on_cpu(lab_run: Path) -> None:
    assert _stage(lab_run, "nccl_profile")["verdict"] == "SKIP"


def test_accounting_agrees_with_the_runner_on_every_job(lab_run: Path) -> None:
    """The run's accounting step (lcm_runner/stages/accounting.py): sacct has every job of the run, with
    the runs, requeues, nodes and exit codes of the jobs' own batch logs; the node-loss case's job was
    requeued by slurmctld (the agent marked the lost node DOWN), so at least one job has a restart."""
    acct = _stage(lab_run, "accounting")
    assert acct["verdict"] == "PASS", acct["summary"]
    jobs = acct["metrics"]["jobs"]
    logs = {
        p.name.removeprefix("slurm-").removesuffix(".out") for p in (lab_run / "logs").glob("slurm-*.out")
    }
    assert set(jobs) == logs and len(jobs) >= 5, (sorted(jobs), sorted(logs))
    assert all(j["agrees"] for j in jobs.values())
    node_loss = [str(j) for j in _stage(lab_run, "fault")["metrics"]["node_loss"]["job_ids"]]
    requeued = [j for j in node_loss if jobs[j]["sacct_restarts"] >= 1]
    assert requeued, {j: jobs[j] for j in node_loss}
    for j in requeued:
        assert jobs[j]["runner_restarts"] == jobs[j]["sacct_restarts"], jobs[j]
        assert jobs[j]["sacct_states"][-1] == "COMPLETED", jobs[j]
    assert (lab_run / "accounting" / "sacct.txt").is_file()


# The verdict each stage must reach on the lab (CPU nodes: no NCCL, so its profile is skipped; the lab has
# Slurm accounting, so the accounting cross-check runs).
EXPECTED = {
    "baseline": "PASS",
    "resume": "PASS",
    "fault": "PASS",
    "nccl_profile": "SKIP",
    "accounting": "PASS",
}


def test_every_stage_and_the_slo_report_pass_and_the_exit_status_is_0(lab_run_result: LabRun) -> None:
    """`lcm-runner all` exits 0 only when no stage FAILed; the report's own verdict is PASS and it
    names every stage with the verdict the stage recorded (a run whose report says FAIL fails here)."""
    run = lab_run_result
    got = {name: _stage(run.dir, name)["verdict"] for name in EXPECTED}
    assert got == EXPECTED, run.out
    assert run.returncode == 0, run.out
    slo = json.loads((run.dir / "slo.json").read_text())
    assert slo["verdict"] == "PASS", (slo["problems"], [r for r in slo["rows"] if r["status"] == "FAIL"])
    assert not [r for r in slo["rows"] if r["status"] == "FAIL"]
    assert {k: v["verdict"] for k, v in slo["stages"].items()} == EXPECTED
    report = (run.dir / "infra_slo.md").read_text()
    assert "**Verdict: PASS**" in report
    # no table cell of the report is a FAIL (SLO status, stage verdict); sacct's own job states in the
    # accounting table (FAILED for a stage's killed job, NODE_FAIL for the lost node's) are facts, not
    # verdicts
    assert not re.findall(r"^\|.*\|\s*FAIL\s*\|.*$", report, re.MULTILINE)
    assert "NCCL profile verdict: FAIL" not in report


def test_every_rank_of_every_stage_ran_inside_the_container(lab_run_result: LabRun) -> None:
    """With the lab's training image (tests/support/labrun.py), every job step is a Pyxis container:
    each batch script names the image, and the start event of every rank of every job (baseline,
    resume, each fault case, the restarts) records a root filesystem that is an Enroot container's
    (procutil.root_mount: Enroot's data or runtime paths), not the node's own `/`."""
    run = lab_run_result
    if not run.container_image:
        pytest.skip("this lab run uses no container image (LCM_LAB_CONTAINER_IMAGE or the inventory)")
    scripts = sorted((run.dir / "sbatch").glob("*.sbatch"))
    assert scripts, "no batch scripts in the run dir"
    for script in scripts:
        assert f"--container-image={run.container_image}" in script.read_text(), script.name
    starts = of_event(load_run(run.dir), "start")
    assert len(starts) >= 4 * 4, len(starts)  # 4 ranks x (baseline, resume x2, fault jobs ...)
    outside = [
        (s.get("host"), s.rank, s.job, s.get("rootfs"))
        for s in starts
        if not in_enroot_container(str(s.get("rootfs", "")))
    ]
    assert not outside, outside
    jobs = {str(s.job) for s in starts}
    assert len(jobs) >= 4, jobs
