"""The rendered node function under the time-limit signal, for real: bash + torchrun + lcm_runner.train.

Slurm's `--signal=USR1@180` signals every process of the job step. This runs the node function of a
rendered train_2node.sbatch (agent: torchrun, 1 node x 2 CPU ranks), waits for training to be under
way, sends SIGUSR1 to every process of that tree as slurmstepd would, and expects: the shell survives,
torchrun stops its ranks without restarting them, the ranks checkpoint and exit ExitCode.REQUEUE, and
the node function reports 75 (what makes the batch script `scontrol requeue`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lcm_runner import config, render, telemetry
from lcm_runner.contracts import LATEST_FILE, ExitCode

ROOT = Path(__file__).resolve().parents[2]


def _tree(pid: int) -> list[int]:
    out: list[int] = []
    for child in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = child.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            cpid = int(child.parent.name)
            out += [cpid, *_tree(cpid)]
    return out


@pytest.mark.slow
def test_usr1_checkpoints_and_requests_requeue(tmp_path: Path) -> None:
    data = yaml.safe_load((ROOT / "configs" / "lab.yml").read_text())
    data.update(
        agent="torchrun",
        nodes=1,
        procs_per_node=2,
        train_iters=5000,
        save_interval=2500,
        master_port=29677,
        python=sys.executable,
        fault={"kill_at_step": 3000, "kill_node": 0},
    )
    data["model"]["global_batch_size"] = 4
    data["model"]["pp"] = 1  # a world of 2 holds EP=2 only (the lab's PP=2 x EP=2 needs 4 ranks)
    cfg = config.from_dict(data)
    out = render.render_run(config.load_cluster(ROOT / "inventories" / "lab"), cfg, tmp_path / "run")
    func = out.sbatch.read_text().split("lcm_node() {", 1)[1].split("\n}\n", 1)[0]
    script = "lcm_node() {" + func + "\n}\nlcm_node"
    env = {
        **os.environ,
        "LCM_RUN_DIR": str(out.run_dir),
        "LCM_PYTHON": sys.executable,
        "SLURM_NODEID": "0",
        "SLURM_JOB_ID": "9001",
        "MASTER_ADDR": "127.0.0.1",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(ROOT),
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        "GLOO_SOCKET_IFNAME": "lo",
        "LCM_RUN_TAG": "t/9001",
    }
    proc = subprocess.Popen(
        ["bash", "-c", script],
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    started: list[int] = []
    try:
        first = telemetry.follow(
            out.run_dir, lambda r: r.event == "step" and (r.step or 0) >= 20, timeout_s=180
        )
        assert first is not None, "training did not start"
        started = _tree(proc.pid)
        for pid in [proc.pid, *started]:  # what slurmstepd does: every process of the step
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR1)
        output, _ = proc.communicate(timeout=240)
    finally:
        for pid in [*started, proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    recs = telemetry.load_run(out.run_dir)
    exits = telemetry.of_event(recs, "exit")
    assert {r.get("code") for r in exits} == {int(ExitCode.REQUEUE)}, output[-3000:]
    assert proc.returncode == int(ExitCode.REQUEUE)
    assert {r.attempt for r in recs} == {0}  # torchrun did not restart the ranks
    assert (out.run_dir / "checkpoints" / LATEST_FILE).is_file()
