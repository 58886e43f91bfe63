"""roles/nvidia_driver: nvidia-smi/PCI check filters (with real H200 output) and the role's preflight run
for real on localhost (a machine without GPUs; a PCI tree in tmp stands for an HGX node's sysfs)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from _role_run import H200_GPU, IB_FABRIC, REPO, run_role, spec

_spec = importlib.util.spec_from_file_location(
    "nvidia_checks", REPO / "roles/nvidia_driver/filter_plugins/nvidia_checks.py"
)
assert _spec and _spec.loader
nv = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(nv)

# `nvidia-smi --query-gpu=index,name,driver_version,persistence_mode,pci.bus_id,memory.total` on a lent
# H200 (2026-11-30); the role queries the first five fields.
H200_ROW = (Path(__file__).parent / "fixtures/nvidia/h200x1_query.csv").read_text().strip()
H200_SMI = ", ".join(H200_ROW.split(", ")[:5])


def test_upstream_version():
    assert nv.upstream_version("535.309.01-0+deb12u1") == "535.309.01"
    assert nv.upstream_version("580.159.04-1") == "580.159.04"
    assert nv.upstream_version("1:580.159.04-1") == "580.159.04"
    assert nv.upstream_version("580.159.04") == "580.159.04"


def test_real_h200_output_passes_when_spec_and_lock_match():
    assert H200_SMI.startswith("0, NVIDIA H200, 580.159.04, Enabled")
    assert nv.smi_problems(H200_SMI, 1, "580.159.04") == []


def test_smi_problems_name_each_mismatch():
    assert nv.smi_problems(H200_SMI, 8, "580.159.04") == ["nvidia-smi shows 1 GPUs, the spec says 8"]
    assert nv.smi_problems(H200_SMI, 1, "535.309.01-0+deb12u1") == [
        "driver version 580.159.04 is running, the lock says 535.309.01"
    ]
    two = H200_SMI + "\n" + H200_SMI.replace("0, ", "1, ", 1).replace("Enabled", "Disabled")
    assert nv.smi_problems(two, 2, "580.159.04") == ["persistence mode is off on GPU 1"]
    assert nv.smi_problems(two, 2, "580.159.04", persistence=False) == []
    assert "unexpected nvidia-smi line" in nv.smi_problems("NVIDIA-SMI has failed", 1, "580.159.04")[0]


def test_pci_inventory_counts_gpus_and_nvswitches():
    lines = [
        "0000:18:00.0 0x10de 0x030200",
        "0000:2a:00.0 0x10de 0x030000",
        "0000:05:00.0 0x10de 0x068000",
        "0000:06:00.0 0x15b3 0x020700",  # a ConnectX HCA: not NVIDIA
        "0000:07:00.0 0x10de 0x040300",  # NVIDIA HDMI audio: not a GPU
    ]
    inv = nv.pci_inventory(lines)
    assert (inv["gpus"], inv["nvswitches"]) == (2, 1)
    assert inv["gpu_bdfs"] == ["0000:18:00.0", "0000:2a:00.0"]


def _sysfs(tmp_path: Path, gpus: int, switches: int) -> Path:
    """A PCI device tree shaped like /sys/bus/pci/devices of an HGX H200 node (vendor/class files)."""
    root = tmp_path / "pci"
    devices = [("0x10de", "0x030200")] * gpus + [("0x10de", "0x068000")] * switches + [("0x8086", "0x060000")]
    for i, (vendor, klass) in enumerate(devices):
        d = root / f"0000:{i + 0x10:02x}:00.0"
        d.mkdir(parents=True)
        (d / "vendor").write_text(vendor + "\n")
        (d / "class").write_text(klass + "\n")
    return root


def _preflight(tmp_path: Path, cluster: dict, **extra):
    return run_role("nvidia_driver", tmp_path, {"cluster": cluster} | extra, tags="nvidia_driver_preflight")


@pytest.mark.skipif(Path("/dev/nvidia0").exists(), reason="this machine has GPUs (test_nvidia_gpu_host.py)")
def test_preflight_fails_when_spec_says_8_gpus_and_the_node_has_none(tmp_path):
    run = _preflight(tmp_path, spec(gpu=H200_GPU | {"nvswitch": False}, fabric=IB_FABRIC))
    assert run.rc != 0
    msg = " ".join(run.failed_msgs)
    assert "cluster.gpu.count_per_node=8 (model h200) but localhost has 0 NVIDIA GPUs on its PCI bus" in msg
    assert "/dev/nvidia*: none" in msg


def test_preflight_fails_when_fabric_manager_and_driver_versions_differ(tmp_path):
    # source=debian pins bookworm's 535 driver; the lock's Fabric Manager is 580: refuse before any change.
    run = _preflight(tmp_path, spec(gpu=H200_GPU, fabric=IB_FABRIC), nvidia_driver_source="debian")
    assert run.rc != 0
    msg = " ".join(run.failed_msgs)
    assert (
        "Fabric Manager 580.159.04 (lcm_lock.artifacts.fabric_manager) must equal the driver version" in msg
    )
    assert "535.309.01 (lcm_lock.packages.nvidia-driver)" in msg


def test_preflight_passes_on_an_hgx_shaped_pci_tree(tmp_path):
    pci = _sysfs(tmp_path, gpus=8, switches=4)
    run = _preflight(tmp_path, spec(gpu=H200_GPU, fabric=IB_FABRIC), _nvidia_driver_sysfs_pci=str(pci))
    assert run.rc == 0, run.failed_msgs or run.stderr[-2000:]
    facts = run.task("Summarise the NVIDIA devices")["ansible_facts"]["_nvidia_driver_pci"]
    assert (facts["gpus"], facts["nvswitches"]) == (8, 4)


@pytest.mark.parametrize(
    ("gpus", "switches", "expect"), [(8, 0, "shows no NVSwitch"), (7, 4, "has 7 NVIDIA GPUs")]
)
def test_preflight_fails_on_a_degraded_node(tmp_path, gpus, switches, expect):
    pci = _sysfs(tmp_path, gpus=gpus, switches=switches)
    run = _preflight(tmp_path, spec(gpu=H200_GPU, fabric=IB_FABRIC), _nvidia_driver_sysfs_pci=str(pci))
    assert run.rc != 0
    assert expect in " ".join(run.failed_msgs)
