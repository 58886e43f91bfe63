"""Slurm on a converged cluster (default: the lab).

Daemons on the right nodes, one slurm.conf everywhere, node definitions that match the hardware,
every compute node up, `srun -N2 hostname`, graceful preemption (--signal=USR1@<s> reaches the job's
processes, the job requeues itself and runs again), the health check (passes on every compute node;
its failure path drains a real node with the reason, which the test resumes).

Run: pytest tests/infra/test_slurm.py   (LCM_INVENTORY=<inventory dir> for another cluster)
"""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest
import testinfra
from testinfra.utils.ansible_runner import AnsibleRunner

pytestmark = pytest.mark.lab
INVENTORY = os.environ.get("LCM_INVENTORY", str(Path(__file__).resolve().parents[2] / "inventories" / "lab"))
UP_STATES = {"idle", "mixed", "allocated", "completing"}


@cache
def _runner() -> AnsibleRunner:
    return AnsibleRunner(INVENTORY)


@cache
def _host(name: str) -> testinfra.host.Host:
    return testinfra.get_host(f"ansible://{name}", ansible_inventory=INVENTORY)


def _names(group: str) -> list[str]:
    return sorted(_runner().get_hosts(group))


CONTROLLER = _names("controller")[0]
COMPUTE = _names("compute")
NODES = _names("cluster")


@cache
def _spec() -> dict:
    return _runner().get_variables(CONTROLLER)["cluster"]


def _ctl() -> testinfra.host.Host:
    return _host(CONTROLLER)


@cache
def _hostname(name: str) -> str:
    return _host(name).check_output("hostname -s")


def _node_states() -> dict[str, str]:
    out = _ctl().check_output("sinfo --noheader --Node --format='%N|%T'")
    return dict(line.split("|", 1) for line in out.splitlines())


def test_controller_runs_slurmctld_only() -> None:
    ctl = _ctl()
    assert ctl.service("slurmctld").is_running
    assert ctl.service("slurmctld").is_enabled
    assert not ctl.service("slurmd").is_running
    assert not ctl.service("slurmd").is_enabled


@pytest.mark.parametrize("name", COMPUTE)
def test_compute_runs_slurmd_only(name: str) -> None:
    node = _host(name)
    assert node.service("slurmd").is_running
    assert node.service("slurmd").is_enabled
    assert not node.service("slurmctld").is_running
    assert not node.service("slurmctld").is_enabled


def test_same_slurm_conf_everywhere() -> None:
    digests = {n: _host(n).check_output("sha256sum /etc/slurm/slurm.conf").split()[0] for n in NODES}
    assert len(set(digests.values())) == 1, digests


def test_configuration_from_spec() -> None:
    conf = _ctl().check_output("scontrol show config")
    slurm = _spec()["slurm"]
    assert re.search(
        rf"^ProctrackType\s+= {re.escape(slurm.get('proctrack_type', 'proctrack/cgroup'))}$", conf, re.M
    )
    assert re.search(rf"^TaskPlugin\s+= {re.escape(slurm.get('task_plugin', 'task/cgroup'))}$", conf, re.M)
    assert re.search(r"^SelectType\s+= select/cons_tres$", conf, re.M)
    assert re.search(rf"^ClusterName\s+= {_spec()['name']}$", conf, re.M)
    partitions = _ctl().check_output("sinfo --noheader --format=%R").split()
    assert sorted(partitions) == sorted(p["name"] for p in slurm["partitions"])


@pytest.mark.parametrize("name", COMPUTE)
def test_node_definition_matches_hardware(name: str) -> None:
    """slurm.conf's NodeName line (from facts) agrees with what slurmd itself detects."""
    detected = dict(
        kv.split("=", 1) for kv in _host(name).check_output("slurmd -C").splitlines()[0].split() if "=" in kv
    )
    shown = _ctl().check_output(f"scontrol show node {_hostname(name)} --oneliner")
    conf = dict(kv.split("=", 1) for kv in shown.split() if "=" in kv)
    assert conf["CPUTot"] == detected["CPUs"]
    assert conf["Sockets"] == detected["SocketsPerBoard"]
    assert conf["CoresPerSocket"] == detected["CoresPerSocket"]
    assert conf["ThreadsPerCore"] == detected["ThreadsPerCore"]
    assert 0 < int(conf["RealMemory"]) < int(detected["RealMemory"])
    gpus = int(_spec()["gpu"]["count_per_node"])
    if gpus:
        assert f"gpu:{_spec()['gpu']['gres_type']}:{gpus}" in conf["Gres"]


def test_every_compute_node_up() -> None:
    states = _node_states()
    for name in COMPUTE:
        assert states.get(_hostname(name)) in UP_STATES, states


def test_srun_two_nodes_hostname() -> None:
    out = _ctl().check_output("timeout 120 srun --nodes=2 --ntasks-per-node=1 --time=1 hostname")
    assert sorted(out.split()) == sorted(_hostname(n) for n in COMPUTE[:2])


@pytest.fixture
def shared_job_dir() -> Iterator[str]:
    path = f"{_spec()['storage']['checkpoint_dir']}/.lcm-infra-test-{uuid.uuid4().hex[:8]}"
    _host(COMPUTE[0]).check_output(f"mkdir -p {path}")
    yield path
    _host(COMPUTE[0]).run(f"rm -rf {path}")


SIGNAL_JOB = """#!/bin/bash
#SBATCH --nodes=1 --time=2 --signal=USR1@100 --requeue --open-mode=append
#SBATCH --output={dir}/job.out
log={dir}/events
echo "start restart=${{SLURM_RESTART_COUNT:-0}} host=$(hostname -s)" >> "$log"
if [[ "${{SLURM_RESTART_COUNT:-0}}" -ge 1 ]]; then
    echo "resumed" >> "$log"
    exit 0
fi
# The job's process: records USR1 and stops (as the trainer checkpoints and exits 75).
srun --ntasks=1 bash -c 'trap "echo got-USR1 >> {dir}/events; exit 75" USR1; sleep 170 & wait'
rc=$?
echo "step rc=$rc" >> "$log"
if grep -q got-USR1 "$log"; then
    echo "requeue" >> "$log"
    scontrol requeue "$SLURM_JOB_ID"
fi
sleep 30
"""


def test_signal_reaches_job_and_requeue_works(shared_job_dir: str) -> None:
    """A job with --signal=USR1@100 --time=2 gets USR1 in its srun step (at most ~60 s early by Slurm's
    timer resolution), requeues itself with `scontrol requeue` and runs again (SLURM_RESTART_COUNT=1)."""
    node = _host(COMPUTE[0])
    node.check_output(f"cat > {shared_job_dir}/job.sh << 'EOF'\n{SIGNAL_JOB.format(dir=shared_job_dir)}EOF")
    job_id = _ctl().check_output(f"sbatch --parsable {shared_job_dir}/job.sh").strip()
    events = ""
    started = time.monotonic()
    try:
        while time.monotonic() - started < 300:
            events = node.run(f"cat {shared_job_dir}/events 2>/dev/null").stdout
            if "resumed" in events:
                break
            if "got-USR1" in events and "requeue" in events:
                # A requeued job waits for its BeginTime; release it at once (the requeue itself is tested).
                _ctl().run(f"scontrol update JobId={job_id} StartTime=now")
            time.sleep(3)
    finally:
        _ctl().run(f"scancel {job_id}")
    elapsed = time.monotonic() - started
    lines = events.splitlines()
    assert "got-USR1" in lines, events
    assert "requeue" in lines, events
    assert "resumed" in lines, f"not run again within {elapsed:.0f}s: {events}"
    assert lines[0].startswith("start restart=0")
    assert any(line.startswith("start restart=1") for line in lines)
    print(f"signal+requeue+rerun took {elapsed:.0f}s")


@pytest.mark.parametrize("name", COMPUTE)
def test_healthcheck_passes(name: str) -> None:
    out = _host(name).run("/etc/slurm/lcm-healthcheck.sh")
    assert out.rc == 0, out.stderr


def test_healthcheck_failure_drains_the_node() -> None:
    """The real script with a config whose checkpoint dir is missing drains a real node with the reason;
    the test resumes the node afterwards."""
    name = COMPUTE[-1]
    node = _host(name)
    hostname = _hostname(name)
    conf = "/tmp/lcm-hc-test.conf"
    node.check_output(
        f"sed 's|^LCM_HC_CHECKPOINT_DIR=.*|LCM_HC_CHECKPOINT_DIR=/nonexistent/lcm-ckpt|' "
        f"/etc/slurm/lcm-healthcheck.conf > {conf}"
    )
    try:
        out = node.run(f"/etc/slurm/lcm-healthcheck.sh {conf}")
        assert out.rc == 1
        assert "checkpoint dir '/nonexistent/lcm-ckpt' missing" in out.stderr
        shown = _ctl().check_output(f"scontrol show node {hostname}")
        assert "DRAIN" in shown
        assert "Reason=lcm-health: storage: checkpoint dir '/nonexistent/lcm-ckpt' missing" in shown
    finally:
        node.run(f"rm -f {conf}")
        _ctl().run(f"scontrol update NodeName={hostname} State=RESUME")
    assert _node_states()[hostname] in UP_STATES
