"""Validation of the nvidia layer's lock entries before any host changes (lcm_runner/spec/lock_rules.py):
the driver entry of the inventory's nvidia_driver_source, the kernel module package of its flavour (Debian),
Fabric Manager on NVSwitch at exactly the driver's version, the flavour Blackwell needs; each error names the
lock key (or the setting) and both versions."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from lcm_runner.lock import release_lock
from lcm_runner.spec import load_cluster, validate
from lcm_runner.spec.lock_rules import SETTINGS, nvidia_debian_packages, role_settings

ROOT = Path(__file__).resolve().parents[2]
LOCK = release_lock(yaml.safe_load((ROOT / "versions.lock.yml").read_text())["lcm_lock"])
H200 = load_cluster(ROOT / "inventories/example-h200")
LAB = load_cluster(ROOT / "inventories/lab")
DEBIAN = {"nvidia_driver_source": "debian"}


def _lock() -> dict[str, Any]:
    return copy.deepcopy(LOCK)


def _spec(nvswitch: bool = True, model: str = "h200") -> dict[str, Any]:
    spec = copy.deepcopy(H200)
    spec["gpu"].update(nvswitch=nvswitch, model=model, gres_type=model)
    return spec


def _deb(nvswitch: bool = False) -> dict[str, Any]:
    """The H200 spec for Debian's 535 driver: without the nccl layer (the lock's NCCL is built for CUDA 13,
    which needs a 580 driver: its own check in test_spec_lock.py)."""
    spec = _spec(nvswitch=nvswitch)
    spec["layers"]["nccl"] = False
    return spec


def _msgs(spec: dict[str, Any], lock: dict[str, Any], **settings: Any) -> list[str]:
    return [str(e) for e in validate(spec, None, lock, settings)]


def test_the_repository_lock_fits_both_sources_without_nvswitch() -> None:
    assert _msgs(_spec(), _lock()) == []
    assert _msgs(_deb(), _lock(), **DEBIAN) == []
    assert _msgs(_deb(), _lock(), **DEBIAN, nvidia_driver_kernel_module="proprietary") == []


def test_the_lab_needs_no_driver_entry() -> None:
    lock = _lock()
    del lock["artifacts"]["nvidia_driver"], lock["artifacts"]["fabric_manager"]
    assert LAB["layers"]["nvidia"] is False
    assert _msgs(LAB, lock) == []


def test_missing_artifact_driver_names_the_key_and_the_source() -> None:
    lock = _lock()
    del lock["artifacts"]["nvidia_driver"]
    msgs = _msgs(_spec(nvswitch=False), lock)
    assert msgs == [
        "lcm_lock.artifacts.nvidia_driver = null: expected an entry: cluster.layers.nvidia is true and "
        "installs it from the lock (nvidia_driver_source=artifact: the driver version every check expects)"
    ]
    assert _msgs(_deb(), lock, **DEBIAN) == [], "the Debian source does not use the artifact"


def test_missing_debian_driver_package_names_the_key() -> None:
    lock = _lock()
    del lock["packages"]["nvidia-driver"]
    (msg,) = _msgs(_deb(), lock, **DEBIAN)
    assert msg == (
        "lcm_lock.packages.nvidia-driver = null: expected an entry: cluster.layers.nvidia is true and "
        "installs it from the lock (nvidia_driver_source=debian: the driver version every check expects)"
    )


@pytest.mark.parametrize(
    ("flavour", "package", "contrib"),
    [("open", "nvidia-open-kernel-dkms", True), ("proprietary", "nvidia-kernel-dkms", False)],
)
def test_missing_kernel_module_package_names_the_driver_version(
    flavour: str, package: str, contrib: bool
) -> None:
    lock = _lock()
    del lock["packages"][package]
    (msg,) = _msgs(_deb(), lock, **DEBIAN, nvidia_driver_kernel_module=flavour)
    assert msg.startswith(
        f"lcm_lock.packages.{package} = null: expected an entry: cluster.layers.nvidia is true and "
        f"installs it from the lock (nvidia_driver_source=debian, nvidia_driver_kernel_module={flavour}) "
        "at the driver's version 535.309.01 (lcm_lock.packages.nvidia-driver 535.309.01-0+deb12u1)"
    )
    assert ("contrib (source nvidia-open-gpu-kernel-modules)" in msg) == contrib
    other = "nvidia-kernel-dkms" if flavour == "open" else "nvidia-open-kernel-dkms"
    lock = _lock()
    del lock["packages"][other]
    assert _msgs(_deb(), lock, **DEBIAN, nvidia_driver_kernel_module=flavour) == [], (
        "the other flavour's package is not needed"
    )


def test_kernel_module_package_at_another_release_names_both_versions() -> None:
    lock = _lock()
    lock["packages"]["nvidia-open-kernel-dkms"] = "535.261.03-1"
    (msg,) = _msgs(_deb(), lock, **DEBIAN)
    assert msg == (
        'lcm_lock.packages.nvidia-open-kernel-dkms = "535.261.03-1": expected version 535.309.01 like '
        "lcm_lock.packages.nvidia-driver (built from the driver's release)"
    )


def test_missing_fabric_manager_on_nvswitch_names_the_driver_version() -> None:
    lock = _lock()
    del lock["artifacts"]["fabric_manager"]
    (msg,) = _msgs(_spec(), lock)
    assert msg == (
        "lcm_lock.artifacts.fabric_manager = null: expected an entry: cluster.layers.nvidia is true and "
        "installs it from the lock; cluster.gpu.nvswitch is true: Fabric Manager at the driver's version "
        "580.159.04 (lcm_lock.artifacts.nvidia_driver 580.159.04)"
    )
    assert _msgs(_spec(nvswitch=False), lock) == [], "no NVSwitch, no Fabric Manager"


@pytest.mark.parametrize("fm", ["580.159.05-1", "580.159.04.1-1", "570.195.03-1"])
def test_fabric_manager_must_be_exactly_the_driver_version(fm: str) -> None:
    lock = _lock()
    lock["artifacts"]["fabric_manager"]["version"] = fm
    (msg,) = _msgs(_spec(), lock)
    assert msg == (
        f'lcm_lock.artifacts.fabric_manager = "{fm}": expected version 580.159.04 like '
        "lcm_lock.artifacts.nvidia_driver (Fabric Manager must equal the driver version)"
    )


def test_fabric_manager_debian_revision_is_not_part_of_the_version() -> None:
    lock = _lock()
    lock["artifacts"]["fabric_manager"]["version"] = "580.159.04-7"
    assert _msgs(_spec(), lock) == []


def test_fabric_manager_against_the_debian_driver_names_both_versions() -> None:
    (msg,) = _msgs(_deb(nvswitch=True), _lock(), **DEBIAN)
    assert msg == (
        'lcm_lock.artifacts.fabric_manager = "580.159.04-1": expected version 535.309.01 like '
        "lcm_lock.packages.nvidia-driver (Fabric Manager must equal the driver version)"
    )


def test_blackwell_refuses_the_proprietary_modules() -> None:
    spec = _spec(model="b200")
    assert _msgs(spec, _lock()) == []
    (msg,) = _msgs(spec, _lock(), nvidia_driver_kernel_module="proprietary")
    assert msg == (
        'nvidia_driver_kernel_module = "proprietary": expected open: cluster.gpu.model is b200 (Blackwell), '
        "whose GPUs run only with the open kernel modules"
    )
    assert _msgs(_spec(), _lock(), nvidia_driver_kernel_module="proprietary") == [], "Hopper may"


def test_unknown_flavour_and_missing_flavour_package() -> None:
    (msg,) = _msgs(_spec(), _lock(), nvidia_driver_kernel_module="closed")
    assert msg == 'nvidia_driver_kernel_module = "closed": expected open or proprietary'
    (msg,) = _msgs(
        _deb(),
        _lock(),
        **DEBIAN,
        nvidia_driver_debian_kernel_packages={"proprietary": "nvidia-kernel-dkms"},
    )
    assert msg.startswith("nvidia_driver_debian_kernel_packages = ")
    assert "expected a Debian package for nvidia_driver_kernel_module=open" in msg


def test_debian_package_list_follows_the_role() -> None:
    """lock_rules' list is the role's _nvidia_driver_debian_install: the flavour's package replaces any
    kernel module package in nvidia_driver_debian_packages."""
    s = role_settings(DEBIAN)
    assert nvidia_debian_packages(s) == [
        "nvidia-driver",
        "nvidia-smi",
        "firmware-nvidia-gsp",
        "nvidia-persistenced",
        "nvidia-open-kernel-dkms",
    ]
    s = role_settings(
        {
            "nvidia_driver_debian_packages": ["nvidia-driver", "nvidia-kernel-dkms"],
            "nvidia_driver_kernel_module": "open",
        }
    )
    assert nvidia_debian_packages(s) == ["nvidia-driver", "nvidia-open-kernel-dkms"]
    role_vars = (ROOT / "roles/nvidia_driver/vars/main.yml").read_text()
    assert "reject('in', nvidia_driver_debian_kernel_packages.values() | list)" in role_vars
    assert {"nvidia_driver_kernel_module", "nvidia_driver_debian_kernel_packages"} <= set(SETTINGS)


def test_validate_playbook_sees_the_inventorys_kernel_module_setting(tmp_path: Path) -> None:
    """playbooks/validate.yml (lcm_validate_spec) reads nvidia_driver_kernel_module from the inventory."""
    import test_spec_playbook as tsp

    spec = tsp._spec()
    spec["gpu"] = {"model": "b200", "count_per_node": 8, "gres_type": "b200", "nvswitch": True}
    spec["layers"]["nvidia"] = True
    inv = tsp._inventory(tmp_path, spec)
    (inv / "group_vars" / "all" / "settings.yml").write_text("nvidia_driver_kernel_module: proprietary\n")
    out = tsp._run(tmp_path, inv)
    assert out.returncode != 0
    assert 'nvidia_driver_kernel_module = \\"proprietary\\": expected open' in out.stdout or (
        'nvidia_driver_kernel_module = "proprietary": expected open' in out.stdout
    )
    assert "MARKER host task ran" not in out.stdout
