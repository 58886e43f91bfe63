"""roles/common/files/lcm.fact: IOMMU mode parsing and the fact's shape on this machine."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

FACT = Path(__file__).resolve().parents[2] / "roles" / "common" / "files" / "lcm.fact"
_loader = importlib.machinery.SourceFileLoader("lcm_fact", str(FACT))
_spec = importlib.util.spec_from_loader("lcm_fact", _loader)
assert _spec
fact = importlib.util.module_from_spec(_spec)
_loader.exec_module(fact)


@pytest.mark.parametrize(
    ("cmdline", "mode"),
    [
        ("ro quiet", "default"),
        ("intel_iommu=on iommu=pt", "passthrough"),
        ("amd_iommu=on iommu.passthrough=1", "passthrough"),
        ("intel_iommu=on", "translated"),
        ("intel_iommu=off", "off"),
        ("iommu=off", "off"),
    ],
)
def test_iommu_mode(cmdline: str, mode: str) -> None:
    assert fact.iommu(cmdline)["mode"] == mode


def test_iommu_keeps_only_relevant_tokens() -> None:
    parsed = fact.iommu("root=/dev/sda1 intel_iommu=on iommu=pt quiet")
    assert parsed["cmdline"] == ["intel_iommu=on", "iommu=pt"]


def test_fact_script_output_matches_this_machine() -> None:
    out = subprocess.run([sys.executable, str(FACT)], capture_output=True, text=True, check=True)
    data = json.loads(out.stdout)
    assert data["schema"] == 1
    assert data["cpus"] == os.cpu_count()
    assert data["memory_mb"] > 0
    assert data["gpus"]["count"] == len(data["gpus"]["devices"])
    assert data["infiniband"]["count"] == len(data["infiniband"]["devices"])
    assert isinstance(data["can_raise_rlimits"], bool) and isinstance(data["container"], bool)
