"""roles/slurm/files/lcm-healthcheck.sh calls `lcm-runner health check --drain` on GPU nodes (stand-ins for
nvidia-smi, lcm-runner and scontrol on PATH; the rendered conf turns it on only where GPUs are expected)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from _role_render import REPO, render

SCRIPT = REPO / "roles" / "slurm" / "files" / "lcm-healthcheck.sh"


def _stub(bindir: Path, name: str, body: str) -> None:
    (bindir / name).write_text("#!/bin/bash\n" + body)
    (bindir / name).chmod(0o755)


def _run(tmp_path: Path, runner_body: str, health: int = 1) -> tuple[subprocess.CompletedProcess[str], Path]:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (tmp_path / "ck").mkdir()
    _stub(bindir, "nvidia-smi", 'echo "GPU 0: NVIDIA H200 (UUID: GPU-x)"\n')
    _stub(bindir, "lcm-runner", f'echo "$@" > {tmp_path}/runner.args\n{runner_body}')
    _stub(bindir, "scontrol", f'echo "$@" >> {tmp_path}/scontrol.args\n')
    (tmp_path / "exp.json").write_text("{}")
    conf = tmp_path / "conf"
    conf.write_text(
        f"LCM_HC_GPU_COUNT=1\nLCM_HC_MOUNTPOINT={tmp_path}\nLCM_HC_CHECKPOINT_DIR={tmp_path}/ck\n"
        f"LCM_HC_DRAIN=1\nLCM_HC_HEALTH={health}\nLCM_HC_HEALTH_EXPECT={tmp_path}/exp.json\n"
        f"LCM_HC_RUNNER={bindir}/lcm-runner\n"
    )
    env = {"PATH": f"{bindir}:{os.environ['PATH']}", "HOME": "/tmp", "SLURMD_NODENAME": "gpu01"}
    proc = subprocess.run(
        ["bash", str(SCRIPT), str(conf)], capture_output=True, text=True, env=env, timeout=30
    )
    return proc, tmp_path


def test_unhealthy_node_names_the_failing_checks(tmp_path: Path) -> None:
    body = (
        'echo "PASS gpu.count: 1 (expected 1)"; echo "FAIL gpu.xid: Xid 79"\n'
        'echo "FAIL fabric.mlx5_0: Down"; exit 1\n'
    )
    proc, d = _run(tmp_path, body)
    assert proc.returncode == 1
    assert (d / "runner.args").read_text().split() == [
        "health",
        "check",
        "--expect",
        f"{d}/exp.json",
        "--drain",
    ]
    assert (d / "scontrol.args").read_text().strip() == (
        "update NodeName=gpu01 State=DRAIN Reason=lcm-health: health: gpu.xid,fabric.mlx5_0"
    )


def test_healthy_node_passes(tmp_path: Path) -> None:
    proc, d = _run(tmp_path, "exit 0\n")
    assert proc.returncode == 0, proc.stderr
    assert (d / "runner.args").exists()


def test_off_when_no_gpus_expected(tmp_path: Path) -> None:
    proc, d = _run(tmp_path, "exit 1\n", health=0)
    assert proc.returncode == 0 and not (d / "runner.args").exists()


def test_conf_turns_it_on_only_with_gpus() -> None:
    base = {
        "slurm_healthcheck_ib_hcas": [],
        "slurm_healthcheck_ib_rate_gbps": 0,
        "slurm_healthcheck_storage_type": "lab_shared",
        "slurm_healthcheck_mountpoint": "/shared",
        "slurm_healthcheck_checkpoint_dir": "/shared/checkpoints",
    }
    gpu = render("slurm", "lcm-healthcheck.conf.j2", base | {"slurm_healthcheck_gpu_count": 8})
    cpu = render("slurm", "lcm-healthcheck.conf.j2", base | {"slurm_healthcheck_gpu_count": 0})
    assert "LCM_HC_HEALTH=1" in gpu and "LCM_HC_HEALTH=0" in cpu
    assert "LCM_HC_RUNNER=/opt/lcm/venv/bin/lcm-runner" in gpu
    assert "LCM_HC_HEALTH_EXPECT=/etc/lcm/node-health.json" in gpu
