"""roles/nvidia_driver on a real NVIDIA machine: the role's preflight (PCI/sysfs GPU count) and verify
(nvidia-smi: GPU count, driver version, persistence) task files run with ansible-playbook on localhost.

Skipped where nvidia-smi is absent (CI, the lab). Run on a GPU machine:
    pytest tests/unit/test_nvidia_gpu_host.py
(with ansible-core importable; LCM_ANSIBLE_PLAYBOOK="python3 -m ansible playbook" when there is no
ansible-playbook script). Expectations come from the machine itself (nvidia-smi -L, /sys/module/nvidia)
and the lock, read independently of the role.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from _role_run import lock, run_role, spec

pytestmark = pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="no nvidia-smi: not a GPU machine")


def _gpu_count() -> int:
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True).stdout
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def _running_driver() -> str:
    return Path("/sys/module/nvidia/version").read_text().strip()


def _cluster(count: int) -> dict:
    gpu = {"model": "h200", "count_per_node": count, "gres_type": "h200", "nvswitch": False}
    return spec(gpu=gpu)


def test_verify_passes_when_spec_and_lock_match_the_machine(tmp_path):
    locked = lock()["artifacts"]["nvidia_driver"]["version"]
    if locked != _running_driver():
        pytest.skip(f"this machine runs {_running_driver()}, the lock pins {locked}")
    run = run_role("nvidia_driver", tmp_path, {"cluster": _cluster(_gpu_count())}, tasks_from="verify")
    assert run.rc == 0, run.failed_msgs or run.stderr[-2000:]
    assert f"{_gpu_count()} GPUs, driver {locked}" in run.task("Fail unless nvidia-smi")["msg"]


def test_verify_fails_when_the_spec_wants_more_gpus(tmp_path):
    n = _gpu_count()
    run = run_role("nvidia_driver", tmp_path, {"cluster": _cluster(n + 7)}, tasks_from="verify")
    assert run.rc != 0
    assert f"nvidia-smi shows {n} GPUs, the spec says {n + 7}" in " ".join(run.failed_msgs)


def test_verify_fails_when_the_running_driver_is_not_the_locked_one(tmp_path):
    # source=debian expects bookworm's 535 driver from lcm_lock.packages.
    run = run_role(
        "nvidia_driver",
        tmp_path,
        {"cluster": _cluster(_gpu_count()), "nvidia_driver_source": "debian"},
        tasks_from="verify",
    )
    want = lock()["packages"]["nvidia-driver"].split("-")[0]
    assert run.rc != 0
    assert f"driver version {_running_driver()} is running, the lock says {want}" in " ".join(run.failed_msgs)


def test_preflight_counts_the_gpus_on_the_pci_bus(tmp_path):
    n = _gpu_count()
    ok = run_role("nvidia_driver", tmp_path, {"cluster": _cluster(n)}, tags="nvidia_driver_preflight")
    assert ok.rc == 0, ok.failed_msgs or ok.stderr[-2000:]
    assert ok.task("Summarise the NVIDIA devices")["ansible_facts"]["_nvidia_driver_pci"]["gpus"] == n
    bad = run_role("nvidia_driver", tmp_path, {"cluster": _cluster(8 * n)}, tags="nvidia_driver_preflight")
    assert bad.rc != 0
    assert f"cluster.gpu.count_per_node={8 * n} (model h200) but localhost has {n} NVIDIA GPUs" in " ".join(
        bad.failed_msgs
    )
