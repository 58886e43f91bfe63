"""Bringing a node into the running lab and taking it out again (playbooks/add_nodes.yml, remove_nodes.yml;
docs/nodes.md), with a training job running on the two nodes all along.

Run from the host with the lab up: `LCM_LAB=1 pytest -m lab tests/lab/test_nodes_join.py` (molecule verify
runs it). The job is the baseline stage of configs/lab.yml held before one of its steps (--hold-at-step, a
hold file on the shared storage) until lab-node3's whole add has finished, so the join lands while it runs
whatever the add's duration on the machine; its losses are compared bit for bit with the baseline of the
session's lab run (`lab_run_result`, the same config: CPU runs are deterministic). The add's burn-in
includes the cross-node all-reduce sweep of lab-node3 with lab-node1 (a partner running the job); both
nodes' reports are asserted. The durations of the add and the removal (and the sweep's figure) are written
to .cache/test-logs/nodes-drill.json (not asserted: docs/nodes.md quotes a committed run).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from labrun import RUNNER, SHARED_HOST, SPEC, LabRun, lab_exec
from prom import query

from lcm_runner.telemetry import load_run, steps

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
NEW = "lab-node3"
PARTNER = "lab-node1"  # the cross-node sweep's partner of the single new node: the first one in service
OLD = ["lab-ctl", "lab-node1", "lab-node2"]
# The job trains steps 1..HOLD_STEP-1 (paced) while lab-node3 is converged, then waits before HOLD_STEP
# until the test removes the hold file after the add: a fixed pace alone lost the race on a loaded CI machine
# (the add outlasted 30 steps x 7 s). The hold keeps the job running through the add whatever the pace, so
# the pace is short: at 1000 ms the 20 steps after the hold alone took 20 s of the drill.
STEP_SLEEP_MS = int(os.environ.get("LCM_NODES_STEP_SLEEP_MS", "200"))
HOLD_STEP = 10
HOLD_FILE = "ci/nodes-drill.hold"  # under /shared: every node sees it
PLAYBOOK_TIMEOUT_S = 1200


def _podman(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *argv], capture_output=True, text=True, timeout=timeout, check=False)


def _on(node: str, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return _podman("exec", node, *argv, timeout=timeout)


LOGS = ROOT / ".cache" / "test-logs"


def _start_playbook(name: str, nodes: str, count: int) -> tuple[subprocess.Popen[str], Path]:
    """`ansible-playbook playbooks/<name> -e nodes=<nodes>` with LAB_COMPUTE_NODES=<count>, its output in
    .cache/test-logs/<name>.log."""
    # As a user runs it: the project's ansible.cfg alone (molecule verify's own ANSIBLE_* settings left out).
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(LAB_COMPUTE_NODES=str(count), ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    env["ANSIBLE_FORCE_COLOR"] = "false"
    LOGS.mkdir(parents=True, exist_ok=True)
    log = LOGS / f"{name}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            ["ansible-playbook", "-i", "inventories/lab", f"playbooks/{name}", "-e", f"nodes={nodes}"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    return proc, log


def _finish(proc: subprocess.Popen[str], log: Path) -> str:
    try:
        proc.wait(timeout=PLAYBOOK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"{log.name}: still running after {PLAYBOOK_TIMEOUT_S} s")
    text = log.read_text()
    assert proc.returncode == 0, text[-8000:]
    assert "failed=0" in text and "unreachable=0" in text
    return text


def _undisturbed_state() -> dict[str, str]:
    """What must not change while a node joins: the containers (same ids, same start), the Slurm daemons
    (same PIDs: no restart) and the munge key."""
    state: dict[str, str] = {}
    for node in OLD:
        inspect = _podman("inspect", "--format", "{{.Id}} {{.State.StartedAt}}", node)
        state[f"{node} container"] = inspect.stdout.strip()
        unit = "slurmctld" if node == "lab-ctl" else "slurmd"
        pid = _on(node, "systemctl", "show", "-p", "MainPID", "--value", unit).stdout.strip()
        state[f"{node} {unit} pid"] = pid
        key = _on(node, "cat", "/etc/munge/munge.key").stdout
        state[f"{node} munge key"] = hashlib.sha256(key.encode()).hexdigest()
    return state


def _node_state(name: str) -> str:
    p = lab_exec("sinfo", "--noheader", "--Node", "--format=%T|%E", "--nodes", name)
    return p.stdout.strip()


def _prometheus_up(node: str) -> list[str]:
    return [r["value"][1] for r in query(f'up{{job="node",node="{node}"}}')]


def _wait(what: str, ok: Callable[[], Any], timeout: float, every: float = 2.0) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = ok()
        if last:
            return last
        time.sleep(every)
    pytest.fail(f"{what} not within {timeout:.0f} s (last: {last!r})")


def _baseline_losses(run_dir: Path, job: str | None = None) -> dict[int, str]:
    recs = [r for r in steps(load_run(run_dir), rank=0) if job is None or r.job == job]
    return {r.step: r.get("loss_hex") for r in recs}


@pytest.fixture(scope="module")
def reference_losses(lab_run_result: LabRun) -> dict[int, str]:
    base = json.loads((lab_run_result.dir / "stages" / "baseline.json").read_text())
    losses = _baseline_losses(lab_run_result.dir, base["job_ids"][0])
    assert sorted(losses) == list(range(1, len(losses) + 1)) and losses
    return losses


@pytest.fixture
def hold() -> Iterator[Path]:
    """The hold file the drill's job waits on before HOLD_STEP; removed at the end whatever happens, so that
    a failed test never leaves a job held."""
    path = SHARED_HOST / HOLD_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("removed by tests/lab/test_nodes_join.py once the add has finished\n")
    yield path
    path.unlink(missing_ok=True)


def test_add_a_node_while_a_job_trains_then_remove_it(reference_losses: dict[int, str], hold: Path) -> None:
    assert _podman("container", "exists", NEW).returncode != 0, f"{NEW} exists: a previous run left it"
    runs = SHARED_HOST / "ci"
    runs.mkdir(parents=True, exist_ok=True)
    (runs / "lab.yml").write_text((ROOT / "configs" / "lab.yml").read_text())
    timings: dict[str, float] = {}

    before = _undisturbed_state()

    # 1. Start the add: lab-node3's container, every layer on it, burn-in, then the join (slurm.conf on every
    #    node, scontrol reconfigure). Nothing of lab-node1/2 or the controller may change meanwhile.
    t0 = time.monotonic()
    add, add_log = _start_playbook("add_nodes.yml", NEW, 3)

    # 2. While lab-node3 is being converged, a training job starts on lab-node1 + lab-node2; held before
    #    HOLD_STEP until the add is over, it is running when the add's burn-in and join come (checked below).
    monitoring_play = "PLAY [Exporters on every node]"
    _wait("the add to reach the monitoring layer", lambda: monitoring_play in add_log.read_text(),
          timeout=PLAYBOOK_TIMEOUT_S, every=3)  # fmt: skip
    result: dict[str, subprocess.CompletedProcess[str]] = {}

    def train() -> None:
        result["p"] = lab_exec(
            RUNNER, "baseline", "-c", "/shared/ci/lab.yml", "-i", SPEC, "--launcher", "slurm",
            "--runs-root", "/shared/runs/nodes-drill", "--step-sleep-ms", str(STEP_SLEEP_MS),
            "--hold-at-step", str(HOLD_STEP), "--hold-file", f"/shared/{HOLD_FILE}",
            "--timeout", "900",
            timeout=1500,
        )  # fmt: skip

    trainer = threading.Thread(target=train, daemon=True)
    trainer.start()
    running = _wait(
        "the training job running on two nodes",
        lambda: [
            ln for ln in lab_exec("squeue", "--noheader", "--states=R", "--format=%i|%N").stdout.split()
            if ln.endswith("|lab-node[1-2]")
        ],
        timeout=180,
    )  # fmt: skip
    job = running[0].split("|")[0]
    assert "PLAY [Burn-in of the nodes being added]" not in add_log.read_text(), (
        "the job started after the add's burn-in: the join was not exercised under a running job"
    )

    text = _finish(add, add_log)
    timings["add_s"] = round(time.monotonic() - t0, 1)
    assert lab_exec("squeue", "--noheader", "--jobs", job, "--format=%T").stdout.strip() == "RUNNING", (
        f"job {job} is not running at the end of the add (held before step {HOLD_STEP} until now)"
    )
    hold.unlink()  # the job goes on: steps HOLD_STEP..30
    assert "RUNNING HANDLER [slurm : Reconfigure slurm]" in text
    assert _undisturbed_state() == before  # same containers, no Slurm daemon restarted, same munge key
    assert _node_state(NEW) == "idle|none"
    health = json.loads(_on(NEW, "cat", "/var/lib/lcm/health/burn-in-health.json").stdout)
    probe = json.loads(_on(NEW, "cat", "/var/lib/lcm/health/burn-in-probe.json").stdout)
    statuses = {c["name"]: c["status"] for c in health["checks"] + probe["checks"]}
    assert "fail" not in statuses.values(), statuses
    assert {"gemm", "copy", "allreduce"} <= {n for n, st in statuses.items() if st == "pass"}, statuses
    # The cross-node sweep: lab-node3 with lab-node1 (both other nodes run the job; on CPU nodes a busy node
    # is a partner), one gloo process each, started at once, met at lab-node3; figure >= the floor.
    assert f"add_nodes: cross-node all-reduce: {NEW} with {PARTNER} (in service, running jobs" in text
    sweep = {}
    for rank, node in enumerate((NEW, PARTNER)):
        report = json.loads(_on(node, "cat", "/var/lib/lcm/health/burn-in-cluster.json").stdout)
        check = next(c for c in report["checks"] if c["name"] == "allreduce")
        assert check["status"] == "pass" and check["scope"] == "cluster", check
        details = check["details"]
        assert (details["nnodes"], details["node_rank"], details["ranks"]) == (2, rank, 2), details
        # the lab's floor: cluster.health.thresholds.none.busbw_cluster_gbps
        assert check["threshold"] == 0.005 and check["value"] >= check["threshold"], check
        sweep[node] = {
            "busbw_gbps": check["value"],
            "master": details["master"],
            "probe_s": report["duration_s"],
        }
    assert sweep[NEW]["master"] == sweep[PARTNER]["master"]
    timings["sweep_busbw_gbps"] = sweep[NEW]["busbw_gbps"]
    timings["sweep_probe_s"] = max(v["probe_s"] for v in sweep.values())
    assert _wait(f"Prometheus scraping {NEW}", lambda: _prometheus_up(NEW) == ["1"], timeout=60)

    # 3. The job was not disturbed: it finishes its 30 steps, once, with the reference losses.
    trainer.join(timeout=1500)
    assert not trainer.is_alive()
    out = result["p"]
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("run dir: ")), None)
    assert line, (out.returncode, out.stdout[-3000:], out.stderr[-2000:])
    run_dir = SHARED_HOST / Path(line.split(": ", 1)[1]).relative_to("/shared")
    stage = json.loads((run_dir / "stages" / "baseline.json").read_text())
    # The stage's step-time stability check is not asserted: the add shares the machine's 2 cores with the
    # job (its steps are slower while lab-node3 installs), which is contention, not disturbance.
    assert stage["checks"]["job completed"] and stage["checks"]["all 30 steps"], stage["summary"]
    assert stage["job_ids"] == [job]
    records = steps(load_run(run_dir), rank=0)
    assert {r.attempt for r in records} == {0}  # no restart
    assert _baseline_losses(run_dir) == reference_losses

    # 4. The new node takes the next job.
    srun = lab_exec("srun", "--nodes=1", f"--nodelist={NEW}", "--time=2", "hostname", timeout=120)
    assert srun.returncode == 0 and srun.stdout.strip() == NEW, (srun.stdout, srun.stderr)
    three = lab_exec("srun", "--nodes=3", "--time=2", "hostname", timeout=120)
    assert sorted(three.stdout.split()) == ["lab-node1", "lab-node2", NEW], (three.stdout, three.stderr)

    # 5. Remove it again: out of Slurm and monitoring, its container gone, the others untouched.
    after_add = _undisturbed_state()
    t0 = time.monotonic()
    _finish(*_start_playbook("remove_nodes.yml", NEW, 3))
    timings["remove_s"] = round(time.monotonic() - t0, 1)
    assert _node_state(NEW) == ""
    assert (
        "not found"
        in lab_exec("scontrol", "show", "node", NEW).stdout + lab_exec("scontrol", "show", "node", NEW).stderr
    )
    assert _podman("container", "exists", NEW).returncode != 0
    assert _undisturbed_state() == after_add
    assert _wait(f"Prometheus no longer scraping {NEW}", lambda: _prometheus_up(NEW) == [], timeout=60)
    two = lab_exec("srun", "--nodes=2", "--time=2", "hostname", timeout=120)
    assert sorted(two.stdout.split()) == ["lab-node1", "lab-node2"], (two.stdout, two.stderr)

    out_file = LOGS / "nodes-drill.json"
    drill = {
        **timings,
        "step_sleep_ms": STEP_SLEEP_MS,
        "job": job,
        # each asserted above before this file is written
        "job_steps": len(records),
        "job_attempts": sorted({r.attempt for r in records}),
        "job_losses_bitwise_as_reference": True,
        "daemons_restarted": 0,
        "containers_recreated": 0,
        "new_node_state_after_add": "idle",
        "new_node_took_job": True,
    }
    out_file.write_text(json.dumps(drill, indent=2) + "\n")
    print(f"nodes drill: {timings}")
