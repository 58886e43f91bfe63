"""lcm_runner.launch.sacct and the accounting cross-check (lcm_runner/stages/accounting.py) on real output
of the lab's Slurm 22.05.8: `sacct --duplicates -P -n -o JobID,JobName,State,ExitCode,NodeList,Start,End`
(tests/unit/fixtures/sacct/) and the batch logs of runner jobs from the same run."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from lcm_runner.launch.sacct import SACCT_FIELDS, SacctError, job_accounts, parse_sacct, sacct_argv
from lcm_runner.stages.accounting import check_run, cross_check, parse_job_log, runner_jobs

FIX = Path(__file__).parent / "fixtures" / "sacct"
# sbatch --wrap true (1), --wrap "exit 3" (2), and a job that ran `scontrol requeue` on itself once (3).
WRAP = (FIX / "lab-22.05.8-jobs-1-3.txt").read_text()
# `lcm-runner all --only fault` on the lab (2026-12-03): the jobs' batch logs and sacct of them. Jobs 10,
# 11 and 30 were hard-killed by the stage (agents and batch shell SIGKILLed: the log says exit 137, sacct
# 9:0); 20 and 25 completed; 35 lost a node, slurmctld requeued it and its second run completed.
FAULT_RUN = FIX / "lab-fault-run"


def test_the_fields_asked_for() -> None:
    argv = sacct_argv(["12", "13"])
    assert argv == ["sacct", "-j", "12,13", "--duplicates", "-P", "-n", "-o", ",".join(SACCT_FIELDS)]
    assert SACCT_FIELDS == ("JobID", "JobName", "State", "ExitCode", "NodeList", "Start", "End")


def test_parse_real_sacct_output() -> None:
    jobs = job_accounts(parse_sacct(WRAP))
    assert sorted(jobs) == ["1", "2", "3"]
    ok, failed, requeued = jobs["1"], jobs["2"], jobs["3"]
    assert [(r.state, r.exit) for r in ok.runs] == [("COMPLETED", "0:0")] and ok.restarts == 0 and ok.ended
    assert [s.step for s in ok.steps] == ["batch"]
    assert (failed.final.state, failed.final.exit_code, failed.final.exit_signal) == ("FAILED", 3, 0)
    # one allocation record per run: the requeued run, then the run that completed
    assert [(r.state, r.exit, r.nodes) for r in requeued.runs] == [
        ("REQUEUED", "0:0", "lab-node[1-2]"),
        ("COMPLETED", "0:0", "lab-node[1-2]"),
    ]
    assert requeued.restarts == 1 and requeued.ended
    assert [(s.step, s.state, s.exit) for s in requeued.steps] == [
        ("batch", "CANCELLED", "0:15"),
        ("batch", "COMPLETED", "0:0"),
    ]


def test_a_requeued_job_waiting_to_start_again_has_not_ended() -> None:
    """Job 3 as sacct showed it while it waited (reason BeginTime) after the requeue: not over yet."""
    job = job_accounts(parse_sacct((FIX / "lab-22.05.8-job-3-pending.txt").read_text()))["3"]
    assert [r.state for r in job.runs] == ["REQUEUED", "PENDING"]
    assert job.runs[1].nodes == "None assigned" and job.runs[1].start == "Unknown"
    assert not job.ended
    assert not job_accounts(parse_sacct(WRAP.splitlines()[4]))["3"].ended  # only the REQUEUED run yet


def test_ten_mixed_faults_in_one_job_agree_with_sacct(tmp_path: Path) -> None:
    """tests/faults/test_mixed_faults_slurm.py's job 63 (2026-12-05): six node faults (killed or cut off),
    each requeued by slurmctld (NODE_FAIL), the seventh run COMPLETED. The batch steps of the runs whose
    node 0 died have no ExitCode in sacct (`63.batch|batch|CANCELLED||lab-node1|...`): parsed as unknown,
    not refused (the accounting stage failed on it)."""
    mixed = FIX / "lab-mixed-faults"
    text = (mixed / "sacct.txt").read_text()
    job = job_accounts(parse_sacct(text))["63"]
    assert (
        [r.state for r in job.runs] == ["NODE_FAIL"] * 6 + ["COMPLETED"] and job.restarts == 6 and job.ended
    )
    unknown = [s for s in job.steps if s.exit == ""]
    assert unknown and {(s.step, s.state) for s in unknown} == {("batch", "CANCELLED")}
    assert (unknown[0].exit_code, unknown[0].exit_signal) == (-1, -1)
    run_dir = tmp_path / "run"
    shutil.copytree(mixed / "logs", run_dir / "logs")

    def run(argv: list[str]) -> str:
        if argv[:3] == ["scontrol", "show", "config"]:
            return "AccountingStorageType   = accounting_storage/slurmdbd\n"
        assert argv == sacct_argv(["63"]), argv
        return text

    res = check_run(run_dir, run=run, wait_s=0)
    assert res.verdict == "PASS", (res.summary, [k for k, ok in res.checks.items() if not ok])
    assert res.summary == "1 job(s), 6 requeue(s): sacct and the runner's logs agree"
    facts = res.metrics["jobs"]["63"]
    assert facts["runner_runs"] == facts["sacct_runs"] == 7 and facts["runner_restarts"] == 6


def test_malformed_sacct_output_is_refused_with_the_line() -> None:
    with pytest.raises(SacctError, match="6 fields, expected 7"):
        parse_sacct("1|wrap|COMPLETED|0:0|lab-node1|2026-12-03T15:52:56")
    with pytest.raises(SacctError, match="ExitCode 'x' is not <code>:<signal>"):
        parse_sacct("1|wrap|COMPLETED|x|lab-node1|a|b")


def _run_dir(tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    shutil.copytree(FAULT_RUN / "logs", run_dir / "logs")
    return run_dir


def _sacct(text: str):  # type: ignore[no-untyped-def]
    """A command runner that answers scontrol and sacct with the lab's captured output."""

    def run(argv: list[str]) -> str:
        if argv[:3] == ["scontrol", "show", "config"]:
            return (
                "AccountingStorageHost   = lab-ctl\nAccountingStorageType   = accounting_storage/slurmdbd\n"
            )
        assert argv == sacct_argv(["10", "11", "20", "25", "30", "35"]), argv
        return text

    return run


def test_runner_logs_of_the_fault_run() -> None:
    jobs = runner_jobs(FAULT_RUN)
    assert list(jobs) == ["10", "11", "20", "25", "30", "35"]
    lost = jobs["35"]
    assert [(r.restart, r.nodes, r.agents_exit, r.requeued) for r in lost.runs] == [
        (0, "lab-node[1-2]", 137, False),
        (1, "lab-node[1-2]", 0, False),
    ]
    assert [(r.restart, r.agents_exit) for r in jobs["10"].runs] == [(0, 137)]


def test_script_requeue_line_marks_the_run() -> None:
    log = (
        "job 7 (restart 0) on gpu[01-02], master gpu01:29500\nagents finished: exit 75\n"
        "requeue: exit 75 (ExitCode.REQUEUE: checkpointed after SIGUSR1/SIGTERM), resuming from the last "
        "checkpoint\n"
        "job 7 (restart 1) on gpu[01-02], master gpu01:29500\nagents finished: exit 0\n"
    )
    job = parse_job_log(log, "7")
    assert [(r.restart, r.agents_exit, r.requeued) for r in job.runs] == [(0, 75, True), (1, 0, False)]


def test_the_fault_run_agrees_with_sacct(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path)
    res = check_run(run_dir, run=_sacct((FAULT_RUN / "sacct.txt").read_text()), wait_s=0)
    assert res.verdict == "PASS", (res.summary, [k for k, ok in res.checks.items() if not ok])
    assert res.summary == "6 job(s), 1 requeue(s): sacct and the runner's logs agree"
    lost = res.metrics["jobs"]["35"]
    assert lost["runner_restarts"] == lost["sacct_restarts"] == 1
    assert lost["sacct_states"] == ["REQUEUED", "COMPLETED"] and lost["runner_exit"] == [137, 0]
    assert res.checks["job 10: run 0 exit"] and res.checks["job 10: run 0 state"]  # killed: 137 vs 9:0
    assert (run_dir / "accounting" / "sacct.txt").read_text() == (FAULT_RUN / "sacct.txt").read_text()


def test_disagreements_fail_naming_the_job_and_the_point(tmp_path: Path) -> None:
    text = (FAULT_RUN / "sacct.txt").read_text()
    # sacct lost the requeue of 35 (only its last run), and 20 failed with 1 where its log says exit 0
    lines = [ln for ln in text.splitlines() if not ln.startswith("35|lcm-fault-node|REQUEUED")]
    lines = [ln.replace("20|lcm-fault-lcm|COMPLETED|0:0", "20|lcm-fault-lcm|FAILED|1:0") for ln in lines]
    res = check_run(_run_dir(tmp_path), run=_sacct("\n".join(lines) + "\n"), wait_s=0)
    assert res.verdict == "FAIL"
    assert "disagree on job(s) 20, 35" in res.summary
    failed = sorted(k for k, ok in res.checks.items() if not ok)
    assert failed == [
        "job 20: run 0 exit",
        "job 20: run 0 state",
        "job 35: restarts",
        "job 35: run 0 exit",  # its log's first run (killed, 137) against sacct's only run (COMPLETED 0:0)
        "job 35: run 0 state",
        "job 35: runs",
    ], failed


def test_a_job_sacct_never_saw_fails(tmp_path: Path) -> None:
    text = "\n".join(
        ln for ln in (FAULT_RUN / "sacct.txt").read_text().splitlines() if not ln.startswith("25")
    )
    res = check_run(_run_dir(tmp_path), run=_sacct(text), wait_s=0)
    assert res.verdict == "FAIL" and res.checks["job 25: in sacct"] is False
    assert res.metrics["jobs"]["25"]["why"] == "sacct has no record of job 25"


def test_skips_without_accounting(tmp_path: Path) -> None:
    """Accounting not configured (AccountingStorageType none): says so and SKIPs, never FAILs."""
    asked: list[list[str]] = []

    def none(argv: list[str]) -> str:
        asked.append(argv)
        return "AccountingStorageType   = accounting_storage/none\n"

    run_dir = _run_dir(tmp_path)
    res = check_run(run_dir, run=none, wait_s=0)
    assert res.verdict == "SKIP" and "Slurm accounting is not configured" in res.summary
    assert asked == [["scontrol", "show", "config"]]  # sacct was not asked
    assert check_run(run_dir, launcher="torchrun").verdict == "SKIP"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no Slurm job logs" in check_run(empty).summary


def test_skips_where_slurm_is_not_reachable(tmp_path: Path) -> None:
    def missing(argv: list[str]) -> str:
        raise FileNotFoundError(argv[0])

    res = check_run(_run_dir(tmp_path), run=missing, wait_s=0)
    assert res.verdict == "SKIP" and "not readable here" in res.summary


def test_cross_check_of_one_job_directly() -> None:
    job = job_accounts(parse_sacct(WRAP))["3"]
    log = "job 3 (restart 0) on lab-node[1-2], master x:1\njob 3 (restart 1) on lab-node[1-2], master x:1\n"
    log += "agents finished: exit 0\n"
    c = cross_check(parse_job_log(log, "3"), job)
    assert c.agrees, c.checks
    assert c.checks["run 0 requeued"] and c.checks["run 1 exit"]
    c = cross_check(
        parse_job_log(log.replace("lab-node[1-2], master x:1\nagents", "lab-node1, master x:1\nagents"), "3"),
        job,
    )
    assert not c.agrees and c.checks["run 1 nodes"] is False


def test_the_slo_report_lists_the_cross_check(tmp_path: Path) -> None:
    from lcm_runner.config import load_run_config
    from lcm_runner.report import build_report

    run_dir = _run_dir(tmp_path)
    check_run(run_dir, run=_sacct((FAULT_RUN / "sacct.txt").read_text()), wait_s=0).write(run_dir)
    build_report(run_dir, load_run_config(Path(__file__).resolve().parents[2] / "configs" / "lab.yml"))
    report = (run_dir / "infra_slo.md").read_text()
    assert "| accounting | PASS | 6 job(s), 1 requeue(s): sacct and the runner's logs agree |" in report
    assert "| 35 | 2 / 2 | 1 / 1 | REQUEUED 9:0, COMPLETED 0:0 | yes |" in report
    assert "| 10 | 1 / 1 | 0 / 0 | FAILED 9:0 | yes |" in report
