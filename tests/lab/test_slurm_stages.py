"""`lcm-runner all --launcher slurm` on the podman lab's controller (real Slurm, two CPU nodes, gloo).

Run from the host: `pytest -m lab tests/lab` (molecule verify runs it). It needs
the lab up (`.lab/READY`), Slurm answering on lab-ctl and the runner installed there
(playbooks/runner.yml: /opt/lcm/venv, /opt/lcm/cluster.yml). The run config is the repo's
configs/lab.yml, copied into the lab's shared directory; the results are read back from it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
LAB = Path(os.environ.get("LCM_LAB_DIR", ROOT / ".lab"))
SHARED_HOST = LAB / "shared"  # the lab's /shared, seen from the host
CTL = os.environ.get("LCM_LAB_CONTROLLER", "lab-ctl")
RUNNER = os.environ.get("LCM_LAB_RUNNER", "/opt/lcm/venv/bin/lcm-runner")
SPEC = os.environ.get("LCM_LAB_SPEC", "/opt/lcm/cluster.yml")
TIMEOUT_S = int(os.environ.get("LCM_LAB_TIMEOUT_S", "1800"))


def _exec(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", "exec", CTL, *argv], capture_output=True, text=True, timeout=timeout, check=False
    )


FORCED = os.environ.get("LCM_LAB") == "1"  # molecule verify sets it: a missing lab is then a failure


def _unavailable(why: str) -> None:
    if FORCED:
        pytest.fail(f"LCM_LAB=1 but {why}")
    pytest.skip(why)


@dataclass(frozen=True)
class LabRun:
    dir: Path
    returncode: int
    out: str


@pytest.fixture(scope="module")
def lab_run_result() -> LabRun:
    if not ((LAB / "READY").exists() or FORCED) or shutil.which("podman") is None:
        _unavailable("the lab is not up (.lab/READY missing; LCM_LAB=1 forces)")
    if _exec("sinfo", "-h").returncode != 0:
        _unavailable("Slurm does not answer on the lab controller")
    if _exec("test", "-x", RUNNER).returncode != 0:
        _unavailable(f"{RUNNER} is not installed on {CTL} (playbooks/runner.yml)")
    ci = SHARED_HOST / "ci"
    ci.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "configs" / "lab.yml", ci / "lab.yml")
    p = _exec(
        RUNNER,
        "all",
        "-c",
        "/shared/ci/lab.yml",
        "-i",
        SPEC,
        "--launcher",
        "slurm",
        "--runs-root",
        "/shared/runs",
        "--step-sleep-ms",
        "30",
        "--timeout",
        "600",
        timeout=TIMEOUT_S,
    )
    print(p.stdout[-20000:], p.stderr[-5000:])
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("run dir: ")), None)
    assert line, f"no run dir printed (exit {p.returncode}): {p.stderr[-2000:]}"
    run_dir = SHARED_HOST / Path(line.split(": ", 1)[1]).relative_to("/shared")
    assert run_dir.is_dir()
    return LabRun(run_dir, p.returncode, p.stdout[-3000:] + p.stderr[-3000:])


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


# The verdict each stage must reach on the lab (CPU nodes: no NCCL, so its profile is skipped).
EXPECTED = {"baseline": "PASS", "resume": "PASS", "fault": "PASS", "nccl_profile": "SKIP"}


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
    assert "PASS" in report and "FAIL" not in report
