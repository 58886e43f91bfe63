"""Slurm on a converged cluster.

Daemons on the right nodes, one slurm.conf everywhere, node definitions that match what slurmd detects,
every compute node up, `srun -N2 hostname`, graceful preemption (--signal=USR1@<s> reaches the job's
processes, the job requeues itself and runs again), the health check (passes on every compute node;
its failure path drains a real node with the reason; the test resumes it).

Run: pytest tests/infra/test_slurm.py --hosts=ansible://all --ansible-inventory=inventories/<name>
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import testinfra
from conftest import cluster_spec, lock_for, role_defaults

UP_STATES = {"idle", "mixed", "allocated", "completing"}


def _group(host: Any, group: str) -> list[Any]:
    inventory = host.backend.ansible_inventory
    names = sorted(set(host.ansible.get_variables()["groups"].get(group, [])))
    return [testinfra.get_host(f"ansible://{n}", ansible_inventory=inventory) for n in names]


def _node_states(ctl: Any) -> dict[str, str]:
    out = ctl.check_output("sinfo --noheader --Node --format='%N|%T'")
    return dict(line.split("|", 1) for line in out.splitlines())


@pytest.mark.groups("controller")
def test_controller_runs_slurmctld_only(host: Any) -> None:
    assert host.service("slurmctld").is_running
    assert host.service("slurmctld").is_enabled
    assert not host.service("slurmd").is_running
    _assert_not_enabled(host, "slurmd")


@pytest.mark.groups("compute")
def test_compute_runs_slurmd_only(host: Any) -> None:
    assert host.service("slurmd").is_running
    assert host.service("slurmd").is_enabled
    assert not host.service("slurmctld").is_running
    _assert_not_enabled(host, "slurmctld")


# What a Slurm daemon logs when it was started before its configuration was rendered (apt's start with the
# package defaults): 24.11's configless lookup and systemd's 90 s start timeout on it, or no slurm.conf.
_STARTED_UNCONFIGURED = re.compile(
    r"fetch_config|_establish_configuration|start operation timed out|Unable to process configuration file"
    r"|slurm\.conf.*(No such file|not found)"
)


@pytest.mark.groups("controller", "compute")
def test_no_slurm_daemon_ever_started_unconfigured(host: Any) -> None:
    """roles/slurm installs with defer_start: apt never starts slurmd or slurmctld before run.yml (a fresh
    Debian 13 install otherwise waited 90 s per converge for slurmd's start timeout). The journal covers
    everything since the node booted, the first converge included."""
    log = host.check_output("journalctl --no-pager -o cat -u slurmd.service -u slurmctld.service")
    bad = [line for line in log.splitlines() if _STARTED_UNCONFIGURED.search(line)]
    assert not bad, bad[:5]


def _assert_not_enabled(host: Any, unit: str) -> None:
    """Disabled, masked or not installed. testinfra's is_enabled accepts exit 0/1 only: systemd 257 (Debian
    13) answers a unit that is not installed with exit 4 and `not-found` (252 on Debian 12: exit 1)."""
    out = host.run("systemctl is-enabled %s", unit)
    state = out.stdout.strip() or out.stderr.strip()
    assert out.rc != 0 and (state in ("disabled", "masked", "not-found") or "No such file" in state), (
        unit,
        out.rc,
        state,
    )


def _assert_listens_on_the_cluster_interface(host: Any, daemon: str, port: int) -> None:
    spec = cluster_spec(host)
    listening = [
        line.split()[3]
        for line in host.check_output("ss -Hltn").splitlines()
        if line.split()[3].rsplit(":", 1)[-1] == str(port)
    ]
    assert listening, f"{daemon} listens on no address with port {port}"
    if spec["slurm"].get("bind_any_address", False):
        return
    me = host.check_output("getent ahostsv4 $(hostname) | awk 'NR==1{print $1}'").strip()
    assert listening == [f"{me}:{port}"], (daemon, listening, me)


@pytest.mark.groups("compute")
def test_slurmd_listens_on_the_cluster_interface(host: Any) -> None:
    """Unless the spec sets slurm.bind_any_address, slurmd listens on the address the node's name
    resolves to, never on every address (0.0.0.0 / [::]): CommunicationParameters=NoInAddrAny."""
    _assert_listens_on_the_cluster_interface(host, "slurmd", role_defaults("slurm")["slurm_slurmd_port"])


@pytest.mark.groups("controller")
def test_slurmctld_listens_on_the_cluster_interface(host: Any) -> None:
    """The same for slurmctld, which ignores NoInAddrAny and needs its own flag, NoCtldInAddrAny (without
    it, Slurm 22.05's slurmctld listened on 0.0.0.0:6817)."""
    port = role_defaults("slurm")["slurm_slurmctld_port"]
    _assert_listens_on_the_cluster_interface(host, "slurmctld", port)


def test_same_slurm_conf_everywhere(host: Any) -> None:
    mine = host.check_output("sha256sum /etc/slurm/slurm.conf").split()[0]
    for peer in _group(host, "cluster"):
        assert peer.check_output("sha256sum /etc/slurm/slurm.conf").split()[0] == mine


@pytest.mark.groups("controller")
def test_configuration_from_spec(host: Any) -> None:
    spec = cluster_spec(host)
    conf = host.check_output("scontrol show config")
    want = {
        "ProctrackType": spec["slurm"]["proctrack_type"],  # the schema's defaults filled in
        "TaskPlugin": spec["slurm"]["task_plugin"],
        "SelectType": "select/cons_tres",
        "ClusterName": spec["name"],
        "JobRequeue": "1",
    }
    for key, value in want.items():
        assert re.search(rf"^{key}\s+= {re.escape(value)}$", conf, re.M), key
    partitions = host.check_output("sinfo --noheader --format=%R").split()
    assert sorted(partitions) == sorted(p["name"] for p in spec["slurm"]["partitions"])


def test_the_installed_slurm_is_the_locked_release(host: Any) -> None:
    """scontrol is the lock's Slurm for the node's Debian release (22.05 on bookworm, 24.11 on trixie), and
    slurm.conf says which release it was rendered for."""
    pinned = lock_for(host)["packages"]["slurm-client"]  # e.g. 24.11.5-4+deb13u1
    upstream = pinned.split(":", 1)[-1].split("-", 1)[0]
    assert host.check_output("scontrol version").split()[-1] == upstream
    major_minor = ".".join(upstream.split(".")[:2])
    assert host.file("/etc/slurm/slurm.conf").contains(f"^# For Slurm {re.escape(major_minor)} ")


# A configuration key the running release renamed, removed or rejects shows as a daemon-level error or
# warning at start (24.11: "error: Configured MailProg is invalid"); job-step lines ("[12.0] ...") are not
# about the configuration.
_CONFIG_COMPLAINT = re.compile(
    r"^\[[^\]]+\] (?:error|warning): .*(?:invalid|unknown|unrecogni[sz]ed|obsolete|deprecated|no longer|"
    r"not supported|ignor)",
    re.I,
)


def _complaints_since_start(host: Any, log: str, started: str) -> list[str]:
    lines = host.file(log).content_string.splitlines()
    starts = [i for i, line in enumerate(lines) if re.search(started, line)]
    assert starts, f"{log}: no '{started}' line"
    return [line for line in lines[starts[-1] :] if _CONFIG_COMPLAINT.search(line)]


@pytest.mark.groups("controller")
def test_slurmctld_takes_the_configuration_without_complaint(host: Any) -> None:
    assert (
        _complaints_since_start(host, "/var/log/slurm/slurmctld.log", r"slurmctld version \S+ started") == []
    )


@pytest.mark.groups("compute")
def test_slurmd_takes_the_configuration_without_complaint(host: Any) -> None:
    assert _complaints_since_start(host, "/var/log/slurm/slurmd.log", r"slurmd version \S+ started") == []


@pytest.mark.groups("compute")
def test_node_definition_matches_hardware(host: Any) -> None:
    """slurm.conf's NodeName line (rendered from facts) agrees with what slurmd itself detects."""
    detected = dict(kv.split("=", 1) for kv in host.check_output("slurmd -C").splitlines()[0].split())
    shown = host.check_output(f"scontrol show node {detected['NodeName']} --oneliner")
    conf = dict(kv.split("=", 1) for kv in shown.split() if "=" in kv)
    assert conf["CPUTot"] == detected["CPUs"]
    assert conf["Sockets"] == detected["SocketsPerBoard"]
    assert conf["CoresPerSocket"] == detected["CoresPerSocket"]
    assert conf["ThreadsPerCore"] == detected["ThreadsPerCore"]
    assert 0 < int(conf["RealMemory"]) < int(detected["RealMemory"])
    # NodeAddr: the inventory's slurm_node_addr (the lab: the node's address), else Slurm uses the name
    want = host.ansible.get_variables().get("slurm_node_addr") or detected["NodeName"]
    assert conf["NodeAddr"] == want
    gpu = cluster_spec(host)["gpu"]
    if int(gpu["count_per_node"]):
        assert f"gpu:{gpu['gres_type']}:{gpu['count_per_node']}" in conf["Gres"]


@pytest.mark.groups("controller")
def test_every_compute_node_up(host: Any) -> None:
    states = _node_states(host)
    for node in _group(host, "compute"):
        name = node.check_output("hostname -s")
        assert states.get(name) in UP_STATES, states


@pytest.mark.groups("controller")
def test_srun_two_nodes_hostname(host: Any) -> None:
    compute = _group(host, "compute")
    assert len(compute) >= 2, "needs two compute nodes"
    out = host.check_output("timeout 120 srun --nodes=2 --ntasks-per-node=1 --time=1 hostname")
    assert sorted(out.split()) == sorted(n.check_output("hostname -s") for n in compute[:2])


def _cgroup_spec(host: Any) -> dict:
    slurm = cluster_spec(host)["slurm"]
    if "task/cgroup" not in slurm["task_plugin"] or slurm["proctrack_type"] != "proctrack/cgroup":
        pytest.skip(
            f"the spec does not use the cgroup plugins ({slurm['proctrack_type']}, {slurm['task_plugin']})"
        )
    return slurm


@pytest.mark.groups("controller")
def test_job_steps_run_in_their_own_cgroups(host: Any) -> None:
    """proctrack/cgroup + task/cgroup: a step's processes are in Slurm's job/step cgroups."""
    _cgroup_spec(host)
    out = host.check_output("timeout 120 srun --nodes=1 --ntasks=1 --time=1 cat /proc/self/cgroup")
    for ctrl in ("memory", "freezer", "cpuset"):
        assert re.search(rf"^\d+:{ctrl}:/slurm_?[^/]*/uid_\d+/job_\d+/step_0", out, re.M), (ctrl, out)


@pytest.mark.groups("controller")
def test_a_job_cannot_exceed_its_memory(host: Any) -> None:
    """ConstrainRAMSpace: 400 MB written under --mem=100M is killed (Slurm reports the OOM kill, sacct
    OUT_OF_MEMORY where accounting is on); 50 MB under --mem=200M runs."""
    slurm = _cgroup_spec(host)
    name = f"lcm-oom-{uuid.uuid4().hex[:8]}"
    alloc = "python3 -c \"b = b'x' * ({mb} * 1024 * 1024); print(len(b))\""
    srun = "timeout 120 srun --nodes=1 --ntasks=1 --time=1"
    over = host.run(f"{srun} --job-name={name} --mem=100M {alloc.format(mb=400)}")
    assert over.rc != 0, over.stdout
    assert re.search(r"oom[- _]kill|out of memory", over.stdout + over.stderr, re.I), over.stderr
    fits = host.run(f"{srun} --mem=200M {alloc.format(mb=50)}")
    assert fits.rc == 0 and fits.stdout.strip() == str(50 * 1024 * 1024), fits.stderr
    if not slurm.get("accounting", {}).get("enabled"):
        return
    deadline, states = time.time() + 60, ""
    while time.time() < deadline:
        states = host.check_output(f"sacct --name={name} --allocations --noheader --parsable2 --format=State")
        if states.strip() and "RUNNING" not in states and "PENDING" not in states:
            break
        time.sleep(2)
    assert states.split() == ["OUT_OF_MEMORY"], states


@pytest.fixture
def shared_job_dir(host: Any) -> Iterator[str]:
    path = f"{cluster_spec(host)['storage']['checkpoint_dir']}/.lcm-infra-test-{uuid.uuid4().hex[:8]}"
    node = _group(host, "compute")[0]
    node.check_output(f"mkdir -p {path}")
    yield path
    node.run(f"rm -rf {path}")


SIGNAL_JOB = """#!/bin/bash
#SBATCH --nodes=1 --time=3 --signal=USR1@100 --requeue --open-mode=append
#SBATCH --output={dir}/job.out
log={dir}/events
echo "start restart=${{SLURM_RESTART_COUNT:-0}} host=$(hostname -s)" >> "$log"
if [[ "${{SLURM_RESTART_COUNT:-0}}" -ge 1 ]]; then
    echo "resumed" >> "$log"
    exit 0
fi
# The job's process records USR1 and stops (as the trainer checkpoints and exits 75).
srun --ntasks=1 bash -c 'trap "echo got-USR1 >> {dir}/events; exit 75" USR1; echo step-up >> {dir}/events
  sleep 170 & wait'
echo "step rc=$?" >> "$log"
if grep -q got-USR1 "$log"; then
    echo "requeue" >> "$log"
    scontrol requeue "$SLURM_JOB_ID"
fi
sleep 30
"""


@pytest.mark.groups("controller")
def test_signal_reaches_job_and_requeue_works(host: Any, shared_job_dir: str) -> None:
    """--signal=USR1@100: USR1 reaches the srun step's process; the job requeues itself with `scontrol
    requeue` and runs again (SLURM_RESTART_COUNT=1).

    Slurm sends the warning when its periodic time-limit check finds end time - 100 s passed (up to 60 s
    early: that check's resolution), so with a limit fixed at submission it could come before srun has
    launched the step (the signal then reaches no process: most likely the Debian 13 failure of the CI of
    2026-12-05) or, to be safe, only 20-80 s after the start (70-88 s of every CI's verify). Here the job
    starts with --time=3; once its step is up (it writes step-up), the test cuts the limit to 2 minutes
    with `scontrol update TimeLimit=2`, which brings the warning within Slurm's next passes of its check
    (every 30 s): Slurm itself then sends it, to the running step, well before the new limit."""
    node = _group(host, "compute")[0]
    node.check_output(f"cat > {shared_job_dir}/job.sh << 'EOF'\n{SIGNAL_JOB.format(dir=shared_job_dir)}EOF")
    job_id = host.check_output(f"sbatch --parsable {shared_job_dir}/job.sh").strip()
    events, released, cut = "", False, None
    started = time.monotonic()
    try:
        while time.monotonic() - started < 300:
            events = node.run(f"cat {shared_job_dir}/events 2>/dev/null").stdout
            if "resumed" in events:
                break
            if "step-up" in events and cut is None:
                host.check_output(f"scontrol update JobId={job_id} TimeLimit=2")
                cut = time.monotonic() - started
            state = host.run(f"squeue --noheader --jobs={job_id} --format='%T|%r'").stdout.strip()
            if "requeue" in events and state.startswith("PENDING") and "BeginTime" in state and not released:
                # Slurm holds a requeued batch job until a BeginTime in the future; start it now
                # (what is tested is that the job was requeued and runs again).
                host.run(f"scontrol update JobId={job_id} StartTime=now")
                released = True
            time.sleep(1)
    finally:
        host.run(f"scancel {job_id}")
    elapsed = time.monotonic() - started
    lines = events.splitlines()
    assert "got-USR1" in lines, f"{events!r}; job {job_id}: {host.run(f'scontrol show job {job_id}').stdout}"
    assert lines.index("step-up") < lines.index("got-USR1")
    assert "requeue" in lines, events
    assert "resumed" in lines, f"not run again within {elapsed:.0f}s: {events}"
    assert lines[0].startswith("start restart=0")
    assert any(line.startswith("start restart=1") for line in lines)
    print(
        f"USR1 -> requeue -> second run took {elapsed:.0f}s (limit cut at {cut:.0f}s; "
        f"BeginTime released early: {released})"
    )


@pytest.mark.groups("compute")
def test_healthcheck_passes(host: Any) -> None:
    out = host.run("/etc/slurm/lcm-healthcheck.sh")
    assert out.rc == 0, out.stderr


@pytest.mark.groups("controller")
def test_healthcheck_failure_drains_the_node(host: Any) -> None:
    """The real script, given a config whose checkpoint dir is missing, drains a real node with the
    reason; the node is resumed afterwards."""
    node = _group(host, "compute")[-1]
    name = node.check_output("hostname -s")
    conf = "/tmp/lcm-hc-test.conf"
    node.check_output(
        "sed 's|^LCM_HC_CHECKPOINT_DIR=.*|LCM_HC_CHECKPOINT_DIR=/nonexistent/lcm-ckpt|' "
        f"/etc/slurm/lcm-healthcheck.conf > {conf}"
    )
    try:
        out = node.run(f"/etc/slurm/lcm-healthcheck.sh {conf}")
        assert out.rc == 1
        assert "checkpoint dir '/nonexistent/lcm-ckpt' missing" in out.stderr
        shown = host.check_output(f"scontrol show node {name}")
        assert "DRAIN" in shown
        assert "Reason=lcm-health: storage: checkpoint dir '/nonexistent/lcm-ckpt' missing" in shown
    finally:
        node.run(f"rm -f {conf}")
        host.run(f"scontrol update NodeName={name} State=RESUME")
    # After RESUME slurmctld pings the node; it shows `idle*` until slurmd answers (a few seconds).
    deadline = time.monotonic() + 60
    while _node_states(host)[name] not in UP_STATES and time.monotonic() < deadline:
        time.sleep(2)
    assert _node_states(host)[name] in UP_STATES
