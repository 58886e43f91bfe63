"""GPU layer (roles/nvidia_driver) on compute nodes: nvidia-smi shows the spec's GPU count at the locked
driver version with persistence mode on; Fabric Manager active on NVSwitch nodes. Skipped where the spec's
layers.nvidia is off (the lab).

Run: pytest tests/infra/test_nvidia.py --hosts=ansible://all --ansible-inventory=inventories/<name>
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
from conftest import REPO, cluster_spec, lock_for, role_var

_spec = importlib.util.spec_from_file_location(
    "nvidia_checks", REPO / "roles/nvidia_driver/filter_plugins/nvidia_checks.py"
)
assert _spec and _spec.loader
nv = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(nv)

pytestmark = pytest.mark.groups("compute")


@pytest.fixture
def spec(host: Any) -> dict[str, Any]:
    spec = cluster_spec(host)
    if not spec["layers"].get("nvidia", False):
        pytest.skip("cluster.layers.nvidia is off")
    return spec


def _expected_version(host: Any) -> str:
    if role_var(host, "nvidia_driver", "nvidia_driver_source") == "debian":
        pkg = role_var(host, "nvidia_driver", "nvidia_driver_debian_packages")[0]
        return nv.upstream_version(lock_for(host)["packages"][pkg])
    return nv.upstream_version(
        lock_for(host)["artifacts"][role_var(host, "nvidia_driver", "nvidia_driver_artifact")]["version"]
    )


def test_gpus_driver_and_persistence(host: Any, spec: dict[str, Any]) -> None:
    out = host.check_output(f"nvidia-smi --query-gpu={nv.SMI_QUERY} --format=csv,noheader")
    problems = nv.smi_problems(out, spec["gpu"]["count_per_node"], _expected_version(host))
    assert problems == []


def test_loaded_module_version(host: Any, spec: dict[str, Any]) -> None:
    assert host.file("/sys/module/nvidia/version").content_string.strip() == _expected_version(host)


def test_fabric_manager_active_on_nvswitch(host: Any, spec: dict[str, Any]) -> None:
    if not spec["gpu"].get("nvswitch"):
        pytest.skip("no NVSwitch in the spec")
    service = host.service("nvidia-fabricmanager")
    assert service.is_running and service.is_enabled


def test_persistenced_running(host: Any, spec: dict[str, Any]) -> None:
    service = host.service("nvidia-persistenced")
    assert service.is_running and service.is_enabled
