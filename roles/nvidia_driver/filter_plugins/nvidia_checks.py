"""Filters of roles/nvidia_driver: PCI inventory, nvidia-smi checks, version comparison.

Pure functions (unit-tested in tests/unit/test_nvidia_driver.py with real nvidia-smi output of an H200).
"""

from __future__ import annotations

from typing import Any

# One copy of the Debian-version -> upstream-version rule, shared with the lock's validation
# ('1:535.309.01-0+deb12u1' -> '535.309.01'); re-exported as this module's filter.
from lcm_runner.spec.lock_nvidia import upstream_version

NVIDIA_VENDOR = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")  # VGA controller, 3D controller (H100/H200/B200 are 3D controllers)
BRIDGE_CLASS = "0x0680"  # "Bridge: other": how NVSwitch chips appear on HGX boards

SMI_QUERY = "index,name,driver_version,persistence_mode,pci.bus_id"


def pci_inventory(lines: list[str]) -> dict[str, Any]:
    """Count NVIDIA GPUs and NVSwitches from '<bdf> <vendor> <class>' lines (read from /sys/bus/pci)."""
    gpus: list[str] = []
    switches: list[str] = []
    for line in lines:
        parts = line.split()
        if len(parts) != 3 or parts[1].lower() != NVIDIA_VENDOR:
            continue
        bdf, klass = parts[0], parts[2].lower()
        if klass.startswith(GPU_CLASSES):
            gpus.append(bdf)
        elif klass.startswith(BRIDGE_CLASS):
            switches.append(bdf)
    return {"gpus": len(gpus), "gpu_bdfs": gpus, "nvswitches": len(switches), "nvswitch_bdfs": switches}


def parse_smi(csv_text: str) -> list[dict[str, str]]:
    """Rows of `nvidia-smi --query-gpu=<SMI_QUERY> --format=csv,noheader`."""
    keys = SMI_QUERY.split(",")
    rows = []
    for line in csv_text.splitlines():
        if not line.strip():
            continue
        values = [v.strip() for v in line.split(",")]
        if len(values) != len(keys):
            raise ValueError(f"unexpected nvidia-smi line (want {len(keys)} fields: {SMI_QUERY}): {line!r}")
        rows.append(dict(zip(keys, values, strict=True)))
    return rows


def smi_problems(
    csv_text: str, expected_count: int, expected_version: str, persistence: bool = True
) -> list[str]:
    """Every way the GPUs nvidia-smi shows differ from the spec and the lock (empty list = healthy)."""
    try:
        rows = parse_smi(csv_text)
    except ValueError as exc:
        return [str(exc)]
    problems = []
    if len(rows) != int(expected_count):
        problems.append(f"nvidia-smi shows {len(rows)} GPUs, the spec says {int(expected_count)}")
    want = upstream_version(expected_version)
    versions = sorted({r["driver_version"] for r in rows})
    if rows and versions != [want]:
        problems.append(f"driver version {', '.join(versions)} is running, the lock says {want}")
    if persistence:
        off = [r["index"] for r in rows if r["persistence_mode"].lower() != "enabled"]
        if off:
            problems.append(f"persistence mode is off on GPU {', '.join(off)}")
    return problems


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "nvidia_upstream_version": upstream_version,
            "nvidia_pci_inventory": pci_inventory,
            "nvidia_smi_problems": smi_problems,
        }
