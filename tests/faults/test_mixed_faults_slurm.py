"""Ten faults of mixed kinds in ONE Slurm job on the lab (issue 10, item 10): the job of configs/lab.yml
(2 nodes x 2 ranks, PP=2 across the nodes, EP=2) with a checkpoint every SAVE steps, paced (render
--step-sleep-ms) so that the faults land mid-run, on a lab of three compute nodes (one spare):

- rank: every trainer rank of one node SIGKILLed (lcm_runner.launch.procs kill-trainer inside the node);
  its agent restarts them in place from the last checkpoint (same job run, no requeue);
- node: the node's container SIGKILLed (podman kill); the survivor's agent sees the heartbeat (or the
  node-0 store) go, marks the node DOWN, the job is requeued onto the survivor and the spare; the killed
  node is started again at once (it registers and returns to service: the next spare);
- partition: the node's container cut off the lab network (podman network disconnect) for PARTITION_S
  seconds; detected and requeued the same way; reconnected with its address, the node returns to service
  by itself (the node watchdog).

Victims (either node of the job, node 0 with the agents' store included) and the number of healthy steps
after the last checkpoint before each fault come from a seeded RNG (printed). Each recovery is checked as
it happens (training resumes at the last checkpoint + 1: no step lost beyond it) and recorded with its
downtime (fault -> first new step) and, for node faults, the detection time, in <run>/recoveries.json.
At the end the job has COMPLETED as one Slurm job (its restarts = the node faults), every step's loss is
bitwise equal to an uninterrupted run of the same config (CPU runs are deterministic), sacct agrees with
the job's log (`lcm-runner accounting`), and every compute node is idle again.

Part of the whole matrix only (`full`: scripts/faults with the lab up, LAB_COMPUTE_NODES=3): about 10 minutes.
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path
from typing import Any

import pytest
from faultmatrix import Matrix, Row
from labnodes import (
    HB_SLACK_S,
    NETWORK,
    NODE_BACK_MAX_S,
    RUNNER,
    Case,
    ctl,
    lab_nodes,
    net_identity,
    node_state,
    reconnect_argv,
    run,
    wait,
)

pytestmark = [pytest.mark.lab, pytest.mark.slow, pytest.mark.full]

KINDS = ("node", "rank", "partition", "rank", "node", "rank", "partition", "rank", "node", "partition")
ITERS = int(os.environ.get("LCM_MIXED_ITERS", "360"))
SAVE = 5
STEP_SLEEP_MS = int(os.environ.get("LCM_MIXED_STEP_SLEEP_MS", "300"))
PARTITION_S = float(os.environ.get("LCM_MIXED_PARTITION_S", "20"))
SEED = int(os.environ.get("LCM_MIXED_SEED", "10"))
PYTHON = "/opt/lcm/venv/bin/python"
OVERRIDES: dict[str, Any] = {
    "save_interval": SAVE,
    "keep_last": 2,
    "max_restarts": 10,
    "time_limit": "00:40:00",
}
# Trainer ranks killed -> first step of the restarted ranks: 1-2 s mostly (the agent restarts them in place).
# Twice in six runs 21 s and 41 s: the restarted generation's gloo group did not form (a rank waited 30 s,
# "DistStoreError: wait timeout after 30000ms, keys: /default_pg/0//cpu//0/0"), the agent restarted it
# again and the next generation trained: recovered, not yet explained (docs/reliability.md).
RANK_FIRST_STEP_MAX_S = 60.0
# A node killed -> the first new step: the 30 s, whichever node of the job it is. Node 0 is the batch
# host (its srun and batch script die with it): the survivor's slurmstepd retries its exit report to that
# srun 6 x TCPTimeout before its step ends (the lab's slurm_tcp_timeout 1 s; at Slurm's 2 s the requeue took
# 25.8 s and the first new step 42 s, docs/scheduler.md#losing-the-batch-host). In an earlier run the
# requeued run's agents resolved the store host's name through podman's DNS, which stalled 10 s right after
# a kill (13.8 and 14.7 s from job start to the first step instead of 4-5 s): the sbatch now gives them
# Slurm's address of it (NodeAddr).
NODE_KILLED_FIRST_STEP_MAX_S = 30.0
# A node cut off: detection takes longer (the batch host: the survivor's store deadman, 2 x hb_timeout_s),
# and the cut-off node's steps are gone only when Slurm has excised it: bounded, not the 30 s.
PARTITION_FIRST_STEP_MAX_S = 45.0
FIRST_STEP_MAX_S = {"node": NODE_KILLED_FIRST_STEP_MAX_S, "partition": PARTITION_FIRST_STEP_MAX_S}
# Node 0 also hosts the agents' store: cut off, it sends no RST, the survivor's store call blocks until its
# deadman fires (2 x hb_timeout_s, lcm_runner.launch.nodefail.Deadman); any other loss is a heartbeat gone.
STORE_HOST_CUT_DETECT_MAX_S = 2 * 3.0 + HB_SLACK_S


@pytest.fixture(scope="module")
def lab() -> list[str]:
    return lab_nodes(3)


def _losses(case: Case) -> dict[int, str]:
    """Step -> loss (hex) of the job, rank 0; a step run again after a restart keeps its last value."""
    return {r["step"]: r["loss_hex"] for r in case.telemetry() if r["event"] == "step"}


def _restarts(case: Case) -> int:
    polled = case.polled()
    return max((r["restarts"] for r in polled), default=0)


def _wait_fault_point(case: Case, since: float, healthy_steps: int) -> int:
    """Until a checkpoint completed after `since` and `healthy_steps` steps ran past it; the last step."""

    def ready() -> int | None:
        recs = [r for r in case.telemetry() if r["ts"] > since]
        ck = [r["step"] for r in recs if r["event"] == "ckpt_end"]
        st = [r["step"] for r in recs if r["event"] == "step"]
        if st and max(st) >= ITERS - 10:
            raise AssertionError(
                f"job {case.job} reached step {max(st)} of {ITERS} before its faults were done"
            )
        if ck and st and max(st) >= min(ck) + healthy_steps:
            return max(st)
        return None

    return wait(ready, 240, 0.1, f"job {case.job}: a checkpoint and {healthy_steps} more steps")


def _kill_trainer(case: Case, node: str) -> float:
    tag = f"{Path(case.run_node).name}/{case.job}"
    p = run(["podman", "exec", node, PYTHON, "-m", "lcm_runner.launch.procs", "kill-trainer", "--tag", tag])
    ans = json.loads(next(ln for ln in reversed(p.stdout.splitlines()) if ln.startswith("{")))
    assert ans["procs"], f"no trainer process of {tag} on {node}: {p.stdout[-500:]} {p.stderr[-500:]}"
    return float(ans["ts"])


def _rank_recovery(case: Case, t0: float) -> dict[str, Any]:
    def first_new_step() -> dict[str, Any] | None:
        recs = case.telemetry()
        resumed = [r for r in recs if r["event"] == "resume" and r["ts"] > t0]
        steps = [r for r in recs if r["event"] == "step" and resumed and r["ts"] > resumed[0]["ts"]]
        return {"resume": resumed[0], "step": steps[0]} if steps else None

    got = wait(first_new_step, 120, 0.2, f"job {case.job}: the first step after the ranks' restart")
    return {
        "first_new_step_s": round(got["step"]["ts"] - t0, 2),
        "first_new_step": got["step"]["step"],
        "resumed_from": got["resume"]["step"],
        "last_ckpt": case.last_ckpt_before(t0),  # t0: the kill's own time, taken in the node
    }


def _wait_spare_idle(nodes: list[str], job_nodes: list[str]) -> str:
    spare = next(n for n in nodes if n not in job_nodes)
    wait(lambda: node_state(spare)[0] == "idle", NODE_BACK_MAX_S + 30, 0.5, f"the spare {spare} idle")
    return spare


def test_ten_mixed_faults_in_one_slurm_job_finish_bitwise(
    lab: list[str], matrix: Matrix, request: pytest.FixtureRequest
) -> None:
    # the uninterrupted reference: the same config and iterations, not paced (pacing changes no number)
    ref = Case("mixed-ref", train_iters=ITERS, overrides=OVERRIDES, poll_s=900)
    try:
        ref.submit()
        ref.wait_done(900)
        want = _losses(ref)
    finally:
        ref.close()
    assert sorted(want) == list(range(1, ITERS + 1)), f"the reference has steps {sorted(want)[:3]}..."

    rng = random.Random(SEED)
    case = Case("mixed", train_iters=ITERS, overrides=OVERRIDES, step_sleep_ms=STEP_SLEEP_MS, poll_s=1800)
    log: list[dict[str, Any]] = []
    down: dict[str, tuple[str, str]] = {}  # a partitioned node -> its address and MAC, until reconnected
    try:
        case.submit()
        wait(case.nodes, 240, 0.5, f"job {case.job} running")
        since = 0.0
        for i, kind in enumerate(KINDS):
            healthy = rng.randint(1, SAVE + 2)
            job_nodes = case.nodes()
            victim = rng.choice(job_nodes)
            batch_host = victim == job_nodes[0]  # node 0: the batch script, srun and the agents' store
            entry: dict[str, Any] = {
                "i": i,
                "kind": kind,
                "victim": victim,
                "batch_host": batch_host,
                "healthy_steps": healthy,
            }
            if kind == "rank":
                entry["at_step"] = _wait_fault_point(case, since, healthy)
                t0 = _kill_trainer(case, victim)
                entry.update(_rank_recovery(case, t0))
                assert set(case.nodes()) == set(job_nodes), "a rank fault moved the job"
                assert entry["first_new_step_s"] <= RANK_FIRST_STEP_MAX_S, entry
            else:
                spare = _wait_spare_idle(lab, job_nodes)
                survivor = next(n for n in job_nodes if n != victim)
                restarts = _restarts(case)
                if kind == "partition":
                    ip, mac = net_identity(victim)
                    assert ip, f"no address of {victim} on {NETWORK}"
                entry["at_step"] = _wait_fault_point(case, since, healthy)
                t0 = time.time()
                if kind == "node":
                    p = run(["podman", "kill", "--signal", "KILL", victim])
                else:
                    p = run(["podman", "network", "disconnect", NETWORK, victim])
                    down[victim] = (ip, mac)
                injected = time.time()
                assert p.returncode == 0, p.stderr
                case.metrics = {"case": case.name, "fault": i}  # this fault's figures only
                case.after_fault(
                    t0,
                    victim,
                    [survivor],
                    spare,
                    survivor_rank=job_nodes.index(survivor),
                    restarts_before=restarts,
                    injected=injected,
                    first_step_max_s=FIRST_STEP_MAX_S[kind],
                    detect_max_s=STORE_HOST_CUT_DETECT_MAX_S if kind == "partition" and batch_host else None,
                )
                m = case.metrics
                entry.update({k: m[k] for k in ("detect_s", "node_down_s", "requeue_s", "first_new_step_s")})
                entry.update(
                    {k: m[k] for k in ("first_new_step", "resumed_from", "last_ckpt", "nodes_after")}
                )
                if kind == "node":
                    assert run(["podman", "start", victim]).returncode == 0  # back: the next spare
                else:
                    time.sleep(max(0.0, t0 + PARTITION_S - time.time()))
                    p = run(reconnect_argv(victim, *down[victim]))
                    assert p.returncode == 0, p.stderr
                    del down[victim]
            assert entry["first_new_step"] == entry["last_ckpt"] + 1, f"fault {i}: a step lost: {entry}"
            entry["steps_lost"] = entry["first_new_step"] - entry["last_ckpt"] - 1
            print(
                f"fault {i}: {kind} of {victim} at step {entry['at_step']} "
                f"(checkpoint {entry['last_ckpt']}): "
                f"first new step {entry['first_new_step']} after {entry['first_new_step_s']:.2f} s"
                + (f", detected after {entry['detect_s']} s" if entry.get("detect_s") is not None else "")
            )
            log.append(entry)
            since = time.time()
        case.wait_done(timeout=1200)
        got = _losses(case)
    finally:
        case.close()
        for node, (ip, mac) in down.items():
            run(reconnect_argv(node, ip, mac))
        for node in lab:
            if (
                run(["podman", "container", "inspect", "-f", "{{.State.Running}}", node]).stdout.strip()
                != "true"
            ):
                run(["podman", "start", node])
        (case.run_host / "recoveries.json").write_text(json.dumps({"job": case.job, "faults": log}, indent=1))

    assert got == want, (
        "losses differ from the uninterrupted run at steps "
        f"{sorted(s for s in set(got) | set(want) if got.get(s) != want.get(s))[:10]}"
    )
    node_faults = sum(k != "rank" for k in KINDS)
    assert _restarts(case) == node_faults, f"Slurm restarts {_restarts(case)}, node faults {node_faults}"
    # sacct agrees with the job's own log: one job, a run per requeue, the last one COMPLETED
    p = ctl(RUNNER, "accounting", "--run-dir", case.run_node, timeout=180)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    acct = json.loads((case.run_host / "stages" / "accounting.json").read_text())
    facts = acct["metrics"]["jobs"][case.job]
    assert facts["sacct_runs"] == node_faults + 1 and facts["sacct_states"][-1] == "COMPLETED", facts
    for node in lab:  # every node back in service by itself (the killed ones after podman start)
        wait(lambda node=node: node_state(node)[0] == "idle", NODE_BACK_MAX_S + 30, 1, f"{node} idle again")

    by_kind = {
        k: [e["first_new_step_s"] for e in log if e["kind"] == k] for k in ("rank", "node", "partition")
    }
    parts = "; ".join(f"{k} x{len(v)}: {min(v):.1f}-{max(v):.1f} s" for k, v in by_kind.items())
    detect = [e["detect_s"] for e in log if e.get("detect_s") is not None]
    matrix.record(
        Row(
            fault="ten mixed faults in one Slurm job (rank, node, partition)",
            injected="lab, 3 compute nodes: " + ", ".join(f"{e['kind']}@{e['at_step']}" for e in log),
            detected_s=max(detect),
            recovered=True,
            downtime_s=round(sum(e["first_new_step_s"] for e in log) / len(log), 2),
            steps_lost=sum(e["steps_lost"] for e in log),
            good_ckpts_lost=0,
            notes=f"mean downtime; {parts}; job {case.job}: {node_faults} requeues, COMPLETED; every step's "
            "loss bitwise equal to the uninterrupted run; sacct agrees",
        ),
        request,
    )
