"""Enroot + Pyxis on a converged cluster where cluster.layers.enroot/pyxis are true. The lab has them
false (no reachable registry carries Enroot or Pyxis), so there every test here is skipped; the
templates and the epilog cleanup logic are tested in tests/unit/test_enroot.py and test_pyxis.py.

Run: pytest tests/infra/test_containers.py   (LCM_INVENTORY=<inventory dir>)
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

import pytest
import testinfra
from testinfra.utils.ansible_runner import AnsibleRunner

pytestmark = pytest.mark.lab
INVENTORY = os.environ.get("LCM_INVENTORY", str(Path(__file__).resolve().parents[2] / "inventories" / "lab"))
# Image for the srun test; a site sets one its nodes can pull (or a local squashfs path).
TEST_IMAGE = os.environ.get("LCM_TEST_CONTAINER_IMAGE", "ubuntu:22.04")


@cache
def _runner() -> AnsibleRunner:
    return AnsibleRunner(INVENTORY)


@cache
def _host(name: str) -> testinfra.host.Host:
    return testinfra.get_host(f"ansible://{name}", ansible_inventory=INVENTORY)


COMPUTE = sorted(_runner().get_hosts("compute"))
CONTROLLER = sorted(_runner().get_hosts("controller"))[0]


@cache
def _layers() -> dict:
    return _runner().get_variables(COMPUTE[0])["cluster"]["layers"]


def _need(layer: str) -> None:
    if not _layers().get(layer):
        pytest.skip(f"cluster.layers.{layer} is false in this inventory")


@pytest.mark.parametrize("name", COMPUTE)
def test_enroot_installed_and_configured(name: str) -> None:
    _need("enroot")
    node = _host(name)
    assert node.package("enroot").is_installed
    conf = node.file("/etc/enroot/enroot.conf")
    assert conf.contains("ENROOT_DATA_PATH .*/user-\\$(id -u)")
    assert node.file("/etc/slurm/epilog.d/50-enroot-cleanup.sh").mode == 0o755
    assert node.run("enroot version").rc == 0


@pytest.mark.parametrize("name", COMPUTE)
def test_pyxis_plugin_registered(name: str) -> None:
    _need("pyxis")
    node = _host(name)
    assert node.file("/usr/local/lib/slurm/spank_pyxis.so").exists
    assert node.file("/etc/slurm/plugstack.conf.d/pyxis.conf").contains("spank_pyxis.so")


def test_srun_container_image() -> None:
    _need("pyxis")
    out = _host(CONTROLLER).run(
        f"timeout 600 srun --nodes=1 --time=10 --container-image={TEST_IMAGE} "
        "grep PRETTY_NAME /etc/os-release"
    )
    assert out.rc == 0, out.stderr
    assert "PRETTY_NAME" in out.stdout
