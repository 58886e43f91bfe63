"""The Slurm launcher's job query: a controller that does not answer is asked again, never read as a
job whose record is gone (the lab, 2026-12-02: slurmctld, busy on 2 cores, logged "Unexpected missing
socket error" for a timed-out `scontrol show job`, and the fault case took its running job for FAILED)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from lcm_runner.config import from_dict
from lcm_runner.launch import slurm
from lcm_runner.launch.base import Job, JobSpec, JobState, LaunchError
from lcm_runner.launch.slurm import SlurmLauncher

CFG = {"launcher": "slurm", "nodes": 2, "procs_per_node": 1, "python": sys.executable}
RUNNING = "JobId=42 JobName=lcm-x JobState=RUNNING ExitCode=0:0 NodeList=lab-node[1-2]\n"
TIMEOUT = "slurm_load_jobs error: Socket timed out on send/recv operation\n"


def _launcher(
    answers: list[Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> tuple[SlurmLauncher, Job]:
    monkeypatch.setattr(slurm.time, "sleep", lambda _s: None)

    def fake(argv: list[str], timeout: float, check: bool, env: dict[str, str] | None) -> str:
        if argv[:3] == ["scontrol", "show", "hostnames"]:
            return "lab-node1\nlab-node2\n"
        assert argv[:3] == ["scontrol", "show", "job"], argv
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    launcher = SlurmLauncher({}, from_dict(CFG), run_cmd=fake)
    return launcher, Job("42", JobSpec("x", tmp_path, [], nodes=2, procs_per_node=1), 0.0, tag="run/42")


def test_a_timed_out_query_is_asked_again(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cmd_timeout = LaunchError("scontrol show job -o timed out after 30s")
    launcher, job = _launcher([TIMEOUT, cmd_timeout, RUNNING], monkeypatch, tmp_path)
    assert launcher.status(job).state == JobState.RUNNING


def test_an_invalid_job_id_is_a_record_gone(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    launcher, job = _launcher(["slurm_load_jobs error: Invalid job id specified\n"], monkeypatch, tmp_path)
    st = launcher.status(job)
    assert st.state == JobState.FAILED and "record gone" in st.reason


def test_a_controller_that_never_answers_is_an_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clock = iter(float(t) for t in range(0, 1000, 5))
    monkeypatch.setattr(slurm.time, "monotonic", lambda: next(clock))
    launcher, job = _launcher([TIMEOUT], monkeypatch, tmp_path)
    with pytest.raises(
        LaunchError, match="no answer from slurmctld: slurm_load_jobs error: Socket timed out"
    ):
        launcher.status(job)
