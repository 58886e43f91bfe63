#!/usr/bin/env python3
"""A rolling change of the lab's compute nodes, measured (playbooks/rolling.yml; docs/nodes.md).

    LAB_COMPUTE_NODES=8 python benchmarks/rolling.py --batch 1 [--nodes 'lab-node6:lab-node7:lab-node8']

On a lab that is up: a job is submitted to the last compute node first (it runs through the roll and must
end COMPLETED: draining waits for jobs, it never kills them); then `ansible-playbook playbooks/rolling.yml
-e rolling_batch=<batch>` runs while Slurm's node states are sampled every 2 s. Written to
benchmarks/results/rolling-<UTC time>.json: the roll's time and exit status, the batches, the most nodes
out of service at one sample (drained, draining or down: must not exceed the batch), the fewest in
service, the job's final state, and each node's state at the end.
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", default="2", help="rolling_batch (a count or a percentage), default 2")
    ap.add_argument("--job-s", type=int, default=90, help="the job's length on the last node (s), default 90")
    ap.add_argument(
        "--nodes", default="", help="rolling_nodes: the nodes to roll (an inventory pattern; default all)"
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
             *(["-e", f"rolling_nodes={a.nodes}"] if a.nodes else [])],
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
