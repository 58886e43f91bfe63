"""The rendered train_2node.sbatch submitted to the podman lab's real Slurm (22.05, two nodes).

The agent's interpreter is a stand-in script (the lab's runner venv is not needed): it records how each
node's task called it and exits 75 (ExitCode.REQUEUE) on the first attempt, 0 after. Checked: sbatch
accepts every directive, MASTER_ADDR is the first node, each node runs the node function with its own
SLURM_NODEID and the spec's NCCL/gloo environment, and exit 75 makes the script `scontrol requeue` the
job, which runs again (Restarts=1) and completes. Slurm holds a requeued job for about two minutes
(BeginTime) before it starts again, so this takes ~3 minutes.

Run from the host: `pytest -m lab tests/unit/test_render_lab.py` (skipped when the lab Slurm is down).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import yaml

from lcm_runner import config, render

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
LAB = Path(os.environ.get("LCM_LAB_DIR", ROOT / ".lab"))
CTL = os.environ.get("LCM_LAB_CONTROLLER", "lab-ctl")
STANDIN = """#!/bin/bash
[ "$1 $2" = "-m lcm_runner.metrics" ] && exit 0  # the training-metrics writer beside the agent
d={run}/out; mkdir -p $d
n=node${{SLURM_NODEID}}-restart${{SLURM_RESTART_COUNT:-0}}
printf '%s\\n' "$@" > $d/argv.$n
{{ echo "host=$(hostname)"; env | grep -E '^(MASTER_|LCM_|NCCL_|GLOO_|TORCH_|OMP_)' | sort; }} > $d/env.$n
[ "${{SLURM_RESTART_COUNT:-0}}" = 0 ] && exit 75
exit 0
"""


def _exec(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", "exec", CTL, *argv], capture_output=True, text=True, timeout=timeout, check=False
    )


def _job(job: str) -> dict[str, str]:
    out = _exec("scontrol", "show", "job", "-o", job).stdout
    return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)


def test_sbatch_on_real_slurm_requeues_on_75() -> None:
    if shutil.which("podman") is None or not (LAB / "shared").is_dir():
        pytest.skip("no podman lab here")
    if _exec("sinfo", "-h").returncode != 0:
        pytest.skip("Slurm does not answer on the lab controller")
    name = f"render-{uuid.uuid4().hex[:8]}"
    run = Path("/shared/runs") / name  # inside the lab
    host = LAB / "shared" / "runs" / name
    host.mkdir(parents=True)
    try:
        (host / "standin").write_text(STANDIN.format(run=run))
        (host / "standin").chmod(0o755)
        data = yaml.safe_load((ROOT / "configs" / "lab.yml").read_text())
        data.update(name=name, python=str(run / "standin"))
        cfg = config.from_dict(data)
        cluster = config.load_cluster(ROOT / "inventories" / "lab")
        (host / "train_2node.sbatch").write_text(render.sbatch_text(cluster, cfg, run))
        (host / "nccl_env.sh").write_text(render.nccl_env_text(cluster, cfg.nccl.debug, cfg.nccl.extra_env))
        (host / "logs").mkdir()
        sub = _exec("sbatch", "--parsable", "--chdir", str(run), str(run / "train_2node.sbatch"))
        assert sub.returncode == 0, sub.stderr
        job = sub.stdout.strip().split(";")[0]
        deadline = time.monotonic() + 420
        state = {}
        while time.monotonic() < deadline:
            state = _job(job)
            if state.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
                break
            time.sleep(5)
        log = (host / "logs" / f"slurm-{job}.out").read_text()
        assert state.get("JobState") == "COMPLETED", (state, log)
        assert state.get("Restarts") == "1"
        assert "requeue: exit 75" in log and "(restart 1)" in log and "agents finished: exit 0" in log
        first = next(ln for ln in log.splitlines() if ln.startswith(f"job {job} (restart 0)"))
        master = first.split("master ")[1].split(":")[0]
        master_node = first.rsplit("(", 1)[1].rstrip(")")
        # the store host by Slurm's address of it (NodeAddr: the lab gives every node's), not by name
        node = _exec("scontrol", "show", "node", master_node, "-o").stdout
        assert f" NodeAddr={master} " in node, (first, node)
        for restart in (0, 1):
            hosts = set()
            for node in (0, 1):
                argv = (host / "out" / f"argv.node{node}-restart{restart}").read_text().split("\n")
                env = dict(
                    ln.split("=", 1)
                    for ln in (host / "out" / f"env.node{node}-restart{restart}").read_text().splitlines()
                )
                assert argv[:2] == ["-m", "lcm_runner.launch.agent"]
                assert argv[argv.index("--node-rank") + 1] == str(node)
                assert argv[argv.index("--master-addr") + 1] == master
                assert env["MASTER_ADDR"] == master and env["LCM_RUN_TAG"] == f"{name}/{job}"
                assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "eth0"
                assert env["NCCL_IB_DISABLE"] == "1" and env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
                hosts.add(env["host"])
            assert len(hosts) == 2 and master_node in hosts
    finally:
        shutil.rmtree(host, ignore_errors=True)
