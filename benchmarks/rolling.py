#!/usr/bin/env python3
"""A rolling change of the lab's compute nodes, measured (playbooks/rolling.yml; docs/nodes.md).

    LAB_COMPUTE_NODES=8 python benchmarks/rolling.py --batch 1 [--nodes 'lab-node6:lab-node7:lab-node8']

On a lab that is up: a job is submitted to the last compute node first (it runs through the roll and must
end COMPLETED: draining waits for jobs, it never kills them); then `ansible-playbook playbooks/rolling.yml
-e rolling_batch=<batch>` runs while Slurm's node states are sampled every 2 s. Written to
benchmarks/results/rolling-<UTC time>.json: the roll's time and exit status, the batches, the most nodes
out of service at one sample (drained, draining or down: must not exceed the batch), the fewest in
service, the job's final state, and each node's state at the end.

    LAB_COMPUTE_NODES=3 python benchmarks/rolling.py --batch 1 --fail-burn-in

The failure path: every batch's burn-in gets an unreachable GEMM floor (`rolling_extra_vars`), so the first
batch fails its burn-in. Checked: the roll exits non-zero after that batch; its nodes are drained with the
burn-in's reason; no node of a later batch was ever out of service; the job on the last node COMPLETED.
Then the operator's repair (`add_nodes.yml -e nodes=<failed nodes>`, no override) is timed and must bring
them back in service.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
CTL = "lab-ctl"
OUT_OF_SERVICE = re.compile(r"drain|down|fail|maint", re.IGNORECASE)


def ctl(*argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", "exec", CTL, *argv], capture_output=True, text=True, timeout=timeout, check=False
    )


def node_states() -> dict[str, str]:
    """Compute node -> Slurm state (sinfo --Node; a node in several partitions keeps its first line)."""
    p = ctl("sinfo", "--noheader", "--Node", "--format=%N %T")
    states: dict[str, str] = {}
    for line in p.stdout.splitlines():
        name, _, state = line.partition(" ")
        states.setdefault(name, state.strip())
    return states


# every batch's burn-in: a GEMM floor no lab node reaches (the others as the lab's own)
UNREACHABLE = {
    "_node_health_thresholds": {
        "gemm_tflops": 1000.0, "copy_gbps": 0.5, "busbw_node_gbps": 0.02, "busbw_cluster_gbps": 0.005,
    }
}  # fmt: skip


def reasons() -> dict[str, str]:
    """Compute node -> Slurm's reason (empty when none)."""
    p = ctl("sinfo", "--noheader", "--Node", "--format=%N|%E")
    return {n: r.strip() for n, _, r in (line.partition("|") for line in p.stdout.splitlines())}


def _failure_path(result: dict, nodes: list[str], samples: list[dict[str, str]], env: dict[str, str]) -> dict:
    """--fail-burn-in: what the failed roll left, then the repair of the failed batch, timed."""
    failed = result["batches"][0].replace(" ", "").split(",") if result["batches"] else []
    later = [n for n in nodes if n not in failed]
    why = reasons()
    touched = sorted({n for s in samples for n in later if OUT_OF_SERVICE.search(s.get(n, "down"))})
    out = {
        "failed_batch": failed,
        "failed_reasons": {n: why.get(n, "") for n in failed},
        "later_nodes_ever_out_of_service": touched,
    }
    t0 = time.monotonic()
    log = REPO / result["log"]
    with (log.parent / "repair.log").open("w") as fh:
        rc = subprocess.run(
            ["ansible-playbook", "playbooks/add_nodes.yml", "-e", "nodes=" + ",".join(failed)],
            cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, check=False,
        ).returncode  # fmt: skip
    states = node_states()
    out["repair"] = {
        "command": "ansible-playbook playbooks/add_nodes.yml -e nodes=" + ",".join(failed),
        "rc": rc,
        "seconds": round(time.monotonic() - t0, 1),
        "states_after": {n: states.get(n) for n in nodes},
    }
    out["ok"] = (
        result["rc"] != 0
        and len(result["batches"]) == 1
        and bool(failed)
        and all(r.startswith("lcm-burn-in:") for r in out["failed_reasons"].values())
        and not touched
        and result["job"]["sacct"].startswith("COMPLETED")
        and rc == 0
        and all(not OUT_OF_SERVICE.search(states.get(n) or "down") for n in nodes)
    )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", default="2", help="rolling_batch (a count or a percentage), default 2")
    ap.add_argument("--job-s", type=int, default=90, help="the job's length on the last node (s), default 90")
    ap.add_argument(
        "--nodes", default="", help="rolling_nodes: the nodes to roll (an inventory pattern; default all)"
    )
    ap.add_argument(
        "--fail-burn-in",
        action="store_true",
        help="the failure path: an unreachable burn-in floor, so the first batch fails and the roll stops",
    )
    a = ap.parse_args(argv)

    before = node_states()
    nodes = sorted(n for n in before if n.startswith("lab-node"))
    if not nodes:
        raise SystemExit("rolling: no lab compute node answers in sinfo (is the lab up?)")
    last = nodes[-1]
    sub = ctl(
        "sbatch", "--parsable", "--job-name=rolling-bench", f"--nodelist={last}", "--wrap", f"sleep {a.job_s}"
    )
    if sub.returncode != 0:
        raise SystemExit(f"rolling: sbatch failed: {sub.stderr}")
    job = sub.stdout.strip().split(";")[0]

    samples: list[dict[str, str]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append(node_states())
            stop.wait(2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    log = RESULTS / f"rolling-{stamp}.logs" / "rolling.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"))
    started = time.monotonic()
    with log.open("w") as out:
        rc = subprocess.run(
            ["ansible-playbook", "playbooks/rolling.yml", "-e", f"rolling_batch={a.batch}",
             *(["-e", f"rolling_nodes={a.nodes}"] if a.nodes else []),
             *(["-e", json.dumps({"rolling_extra_vars": UNREACHABLE})] if a.fail_burn_in else [])],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, check=False,
        ).returncode  # fmt: skip
    seconds = time.monotonic() - started
    stop.set()
    sampler.join()
    out_counts = [sum(1 for n in nodes if OUT_OF_SERVICE.search(s.get(n, "down"))) for s in samples]
    acct = ctl("sacct", "--noheader", "--parsable2", "--jobs", job, "--format=State,ExitCode", "-X")
    batches = re.findall(r"rolling: batch ([^(\"]+) \(", log.read_text())
    after = node_states()
    result = {
        "benchmark": "rolling",
        "time": stamp,
        "git_revision": subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False
        ).stdout.strip(),
        "compute_nodes": len(nodes),
        "batch": a.batch,
        "rolling_nodes": a.nodes or "compute",
        "rc": rc,
        "seconds": round(seconds, 1),
        "batches": [b.strip() for b in batches],
        "seconds_per_batch": round(seconds / max(len(batches), 1), 1),
        "samples": len(samples),
        "max_out_of_service": max(out_counts, default=None),
        "min_in_service": min((len(nodes) - c for c in out_counts), default=None),
        "job": {"id": job, "node": last, "length_s": a.job_s, "sacct": acct.stdout.strip()},
        "states_after": {n: after.get(n) for n in nodes},
        "log": str(log.relative_to(REPO)),
    }
    if a.fail_burn_in:
        result.update(_failure_path(result, nodes, samples, env))
    else:
        result["ok"] = (
            rc == 0
            and result["job"]["sacct"].startswith("COMPLETED")
            and all(not OUT_OF_SERVICE.search(after.get(n) or "down") for n in nodes)
        )
    out_file = RESULTS / f"rolling-{stamp}.json"
    out_file.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=2))
    print(f"[rolling] written {out_file}", file=sys.stderr)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
