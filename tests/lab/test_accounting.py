"""Slurm accounting on the podman lab (roles/slurmdbd): backup and restore of the accounting database,
and the runner's cross-check (lcm-runner accounting) on a job that Slurm requeued.

Runs when the lab is up (.lab/READY, or LCM_LAB=1 to force): pytest -m lab tests/lab/test_accounting.py
- backup/restore: a job runs and is in sacct; playbooks/accounting_backup.yml dumps the database (root
  0600); the database is dropped (sacct loses the job); mode=restore loads the dump; sacct has the job again.
- cross-check: a batch job that prints the runner's own batch log lines (the lines of
  lcm_runner/templates/train.sbatch.j2, rendered by the runner for its jobs) is requeued once with
  `scontrol requeue` while it runs; `lcm-runner accounting` on the lab controller compares its log with
  sacct (PASS, 1 requeue), and a log that claims a run sacct never saw makes it FAIL.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INV = ROOT / "inventories" / "lab"
CTL = "lab-ctl"
SHARED_HOST = ROOT / ".lab" / "shared"
RUNNER = "/opt/lcm/venv/bin/lcm-runner"

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(
        not (ROOT / ".lab" / "READY").exists() and os.environ.get("LCM_LAB") != "1",
        reason="the lab is not up (.lab/READY missing; LCM_LAB=1 forces)",
    ),
]


def ctl(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", "exec", CTL, *argv], capture_output=True, text=True, timeout=timeout, check=False
    )


def ctl_ok(*argv: str, timeout: float = 120) -> str:
    p = ctl(*argv, timeout=timeout)
    assert p.returncode == 0, (argv, p.stdout[-2000:], p.stderr[-2000:])
    return p.stdout


def play(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("ansible-playbook") or str(ROOT / ".venv" / "bin" / "ansible-playbook")
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_FORCE_COLOR": "false"}
    return subprocess.run(
        [exe, "-i", str(INV), "playbooks/accounting_backup.yml", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=ROOT,
        check=False,
    )


def sacct_runs(job: str) -> list[str]:
    """The job's allocation records (one per run): JobID|State|ExitCode."""
    p = ctl("sacct", "-j", job, "--duplicates", "-X", "-P", "-n", "-o", "JobID,State,ExitCode")
    return p.stdout.split() if p.returncode == 0 else []


def wait_ended(job: str, runs: int = 1, timeout: float = 180) -> list[str]:
    deadline = time.monotonic() + timeout
    rows: list[str] = []
    while time.monotonic() < deadline:
        rows = sacct_runs(job)
        if len(rows) >= runs and rows[-1].split("|")[1] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            return rows
        time.sleep(2)
    pytest.fail(f"job {job} did not end in sacct within {timeout:.0f}s: {rows}")


@pytest.fixture(scope="module")
def accounting_on() -> None:
    if shutil.which("podman") is None:
        pytest.fail("podman is missing")
    config = ctl_ok("scontrol", "show", "config")
    if "accounting_storage/slurmdbd" not in config:
        pytest.fail("the lab's Slurm has no accounting (cluster.slurm.accounting): converge site.yml")


def test_backup_drop_restore_keeps_the_jobs(accounting_on: None) -> None:
    job = ctl_ok("sbatch", "--parsable", "-N1", "-t", "1", "-o", "/dev/null", "--wrap", "true").strip()
    assert wait_ended(job) == [f"{job}|COMPLETED|0:0"]

    p = play()  # mode=backup
    assert p.returncode == 0, p.stdout[-3000:]
    dumps = ctl_ok("sh", "-c", "ls -1t /var/backups/lcm-slurmdbd/slurm_acct_db-*.sql.gz").split()
    dump = dumps[0]
    assert dump in p.stdout, p.stdout[-2000:]
    assert ctl_ok("stat", "-c", "%a %U %G", dump).split() == ["600", "root", "root"]
    assert ctl_ok("stat", "-c", "%a %U", "/var/backups/lcm-slurmdbd").split() == ["700", "root"]
    assert ctl_ok("sh", "-c", f"gzip -dc {dump} | grep -c 'INSERT INTO `lab_job_table`'").strip() != "0"

    ctl_ok("mariadb", "-e", "DROP DATABASE slurm_acct_db")
    lost = ctl("sacct", "-j", job, "-X", "-P", "-n", "-o", "JobID,State")
    assert f"{job}|COMPLETED" not in lost.stdout, lost.stdout  # the drop took the job with it

    p = play("-e", "mode=restore", "-e", f"dump={dump}")
    assert p.returncode == 0, p.stdout[-3000:]
    assert wait_ended(job, timeout=60) == [f"{job}|COMPLETED|0:0"]
    assert "lab" in ctl_ok("sacctmgr", "-n", "-P", "list", "cluster", "format=Cluster").split()
    # and accounting goes on: a job after the restore is recorded too
    after = ctl_ok("sbatch", "--parsable", "-N1", "-t", "1", "-o", "/dev/null", "--wrap", "true").strip()
    assert wait_ended(after) == [f"{after}|COMPLETED|0:0"]


def test_restore_refuses_a_missing_dump(accounting_on: None) -> None:
    p = play("-e", "mode=restore", "-e", "dump=/var/backups/lcm-slurmdbd/none.sql.gz")
    assert p.returncode != 0
    assert "is not a file on lab-ctl" in p.stdout, p.stdout[-2000:]
    assert ctl_ok("systemctl", "is-active", "slurmdbd").strip() == "active"  # nothing was stopped


# The runner's batch log lines (lcm_runner/templates/train.sbatch.j2) around a step that sleeps until the
# test requeues the job (first run) or ends at once (second run).
JOB = """#!/bin/bash
#SBATCH --nodes=2
#SBATCH --time=5
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output={log_dir}/slurm-%j.out
echo "job $SLURM_JOB_ID (restart ${{SLURM_RESTART_COUNT:-0}}) on $SLURM_JOB_NODELIST, master x:1"
if [ "${{SLURM_RESTART_COUNT:-0}}" = 0 ]; then touch {flag}.$SLURM_JOB_ID; sleep 120; fi
echo "agents finished: exit 0"
exit 0
"""


def test_cross_check_of_a_requeued_job(accounting_on: None) -> None:
    run = f"acct-{uuid.uuid4().hex[:8]}"
    host_dir = SHARED_HOST / "runs" / run
    (host_dir / "logs").mkdir(parents=True)
    node_dir = f"/shared/runs/{run}"
    (host_dir / "job.sh").write_text(JOB.format(log_dir=f"{node_dir}/logs", flag=f"{node_dir}/running"))
    job = ctl_ok("sbatch", "--parsable", f"{node_dir}/job.sh").strip()
    deadline = time.monotonic() + 120
    while not (host_dir / f"running.{job}").exists():
        assert time.monotonic() < deadline, f"job {job} did not start"
        time.sleep(1)
    ctl_ok("scontrol", "requeue", job)
    runs = wait_ended(job, runs=2, timeout=240)
    assert [r.split("|")[1] for r in runs] == ["REQUEUED", "COMPLETED"], runs

    p = ctl(RUNNER, "accounting", "--run-dir", node_dir, timeout=180)
    assert p.returncode == 0, p.stdout + p.stderr
    result = json.loads((host_dir / "stages" / "accounting.json").read_text())
    assert result["verdict"] == "PASS", result["summary"]
    facts = result["metrics"]["jobs"][job]
    assert facts["runner_runs"] == facts["sacct_runs"] == 2
    assert facts["runner_restarts"] == facts["sacct_restarts"] == 1
    assert facts["sacct_states"] == ["REQUEUED", "COMPLETED"]
    assert "1 requeue(s)" in result["summary"]
    # the allocation records, one per run: lines whose JobID field is the job (a bare substring count
    # would also match a Start or End time whose seconds equal a small job id, "...T06:43:31|")
    rows = (host_dir / "accounting" / "sacct.txt").read_text().splitlines()
    assert [r.split("|")[2] for r in rows if r.split("|")[0] == job] == ["REQUEUED", "COMPLETED"], rows

    # a log claiming a third run that sacct never saw: the cross-check fails, naming the job
    with (host_dir / "logs" / f"slurm-{job}.out").open("a") as f:
        f.write(f"job {job} (restart 2) on lab-node[1-2], master x:1\nagents finished: exit 0\n")
    p = ctl(RUNNER, "accounting", "--run-dir", node_dir, timeout=180)
    assert p.returncode == 1, p.stdout + p.stderr
    result = json.loads((host_dir / "stages" / "accounting.json").read_text())
    assert result["verdict"] == "FAIL" and f"disagree on job(s) {job}" in result["summary"], result
    assert result["checks"][f"job {job}: runs"] is False
    assert result["checks"][f"job {job}: restarts"] is False
