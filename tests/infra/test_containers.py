"""Enroot + Pyxis on a converged cluster where cluster.layers.enroot/pyxis are true. The lab has them
false (no reachable registry carries Enroot or Pyxis), so there every test here is skipped; the
templates and the epilog cleanup logic are tested in tests/unit/test_enroot.py and test_pyxis.py.

Run: pytest tests/infra/test_containers.py --hosts=ansible://all --ansible-inventory=inventories/<name>
LCM_TEST_CONTAINER_IMAGE names an image the nodes can import (default ubuntu:22.04).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from conftest import cluster_spec

TEST_IMAGE = os.environ.get("LCM_TEST_CONTAINER_IMAGE", "ubuntu:22.04")


def _need(host: Any, layer: str) -> None:
    if not cluster_spec(host)["layers"].get(layer):
        pytest.skip(f"cluster.layers.{layer} is false in this inventory")


@pytest.mark.groups("compute")
def test_enroot_installed_and_configured(host: Any) -> None:
    _need(host, "enroot")
    assert host.package("enroot").is_installed
    assert host.file("/etc/enroot/enroot.conf").contains("ENROOT_DATA_PATH .*/user-\\$(id -u)")
    assert host.file("/etc/slurm/epilog.d/50-enroot-cleanup.sh").mode == 0o755
    assert host.run("enroot version").rc == 0


@pytest.mark.groups("compute")
def test_pyxis_plugin_registered(host: Any) -> None:
    _need(host, "pyxis")
    assert host.file("/usr/local/lib/slurm/spank_pyxis.so").exists
    assert host.file("/etc/slurm/plugstack.conf.d/pyxis.conf").contains("spank_pyxis.so")


@pytest.mark.groups("controller")
def test_srun_container_image(host: Any) -> None:
    _need(host, "pyxis")
    out = host.run(
        f"timeout 600 srun --nodes=1 --time=10 --container-image={TEST_IMAGE} "
        "grep PRETTY_NAME /etc/os-release"
    )
    assert out.rc == 0, out.stderr
    assert "PRETTY_NAME" in out.stdout
