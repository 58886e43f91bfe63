"""Shared checkpoint storage on a converged cluster (default: the lab): the checkpoint path is the same
shared directory on every compute node; NFS mounts carry the options for large sequential writes.

Run: pytest tests/infra/test_storage.py   (LCM_INVENTORY=<inventory dir> for another cluster)
"""

from __future__ import annotations

import os
import uuid
from functools import cache
from pathlib import Path

import pytest
import testinfra
from testinfra.utils.ansible_runner import AnsibleRunner

pytestmark = pytest.mark.lab
INVENTORY = os.environ.get("LCM_INVENTORY", str(Path(__file__).resolve().parents[2] / "inventories" / "lab"))


@cache
def _runner() -> AnsibleRunner:
    return AnsibleRunner(INVENTORY)


@cache
def _host(name: str) -> testinfra.host.Host:
    return testinfra.get_host(f"ansible://{name}", ansible_inventory=INVENTORY)


COMPUTE = sorted(_runner().get_hosts("compute"))


@cache
def _storage() -> dict:
    return _runner().get_variables(COMPUTE[0])["cluster"]["storage"]


@pytest.mark.parametrize("name", COMPUTE)
def test_checkpoint_dir_exists_and_is_writable_by_all(name: str) -> None:
    ckpt = _host(name).file(_storage()["checkpoint_dir"])
    assert ckpt.is_directory
    assert ckpt.mode == 0o1777


def test_checkpoint_dir_is_shared() -> None:
    """A file written on one compute node is read back, same bytes, on every other node, and removing it
    there removes it everywhere."""
    path = f"{_storage()['checkpoint_dir']}/.lcm-shared-{uuid.uuid4().hex}"
    token = uuid.uuid4().hex
    writer = _host(COMPUTE[0])
    writer.check_output(f"echo {token} > {path} && sync")
    try:
        for name in COMPUTE:
            assert _host(name).check_output(f"cat {path}") == token, name
    finally:
        _host(COMPUTE[-1]).run(f"rm -f {path}")
    for name in COMPUTE:
        assert not _host(name).file(path).exists, name


@pytest.mark.parametrize("name", COMPUTE)
def test_nfs_mount_options(name: str) -> None:
    if _storage()["type"] != "nfs":
        pytest.skip(f"storage.type is {_storage()['type']}, not nfs")
    out = _host(name).check_output(
        f"findmnt --noheadings --output FSTYPE,OPTIONS --mountpoint {_storage()['mountpoint']}"
    )
    fstype, options = out.split(None, 1)
    assert fstype.startswith("nfs")
    opts = options.split(",")
    assert "hard" in opts
    assert "rsize=1048576" in opts and "wsize=1048576" in opts


@pytest.mark.parametrize("name", COMPUTE)
def test_existing_mount_present(name: str) -> None:
    if _storage()["type"] != "existing":
        pytest.skip(f"storage.type is {_storage()['type']}, not existing")
    assert _host(name).run(f"mountpoint -q {_storage()['mountpoint']}").rc == 0
