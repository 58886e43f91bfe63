"""Shared checkpoint storage on a converged cluster: the checkpoint path is the same shared directory on
every compute node; NFS mounts carry the options for large sequential writes.

Run: pytest tests/infra/test_storage.py --hosts=ansible://all --ansible-inventory=inventories/<name>
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import testinfra
from conftest import cluster_spec


def _compute(host: Any) -> list[Any]:
    inventory = host.backend.ansible_inventory
    names = sorted(set(host.ansible.get_variables()["groups"]["compute"]))
    return [testinfra.get_host(f"ansible://{n}", ansible_inventory=inventory) for n in names]


@pytest.mark.groups("compute")
def test_checkpoint_dir_exists_and_is_writable_by_all(host: Any) -> None:
    ckpt = host.file(cluster_spec(host)["storage"]["checkpoint_dir"])
    assert ckpt.is_directory
    assert ckpt.mode == 0o1777


@pytest.mark.groups("compute")
def test_checkpoint_dir_is_shared(host: Any) -> None:
    """A file written on this node is read back, same bytes, on every compute node, and removing it on
    another node removes it here."""
    path = f"{cluster_spec(host)['storage']['checkpoint_dir']}/.lcm-shared-{uuid.uuid4().hex}"
    token = uuid.uuid4().hex
    host.check_output(f"echo {token} > {path} && sync")
    peers = _compute(host)
    try:
        for peer in peers:
            assert peer.check_output(f"cat {path}") == token, peer.backend.get_hostname()
    finally:
        peers[-1].run(f"rm -f {path}")
    assert not host.file(path).exists


@pytest.mark.groups("compute")
def test_nfs_mount_options(host: Any) -> None:
    storage = cluster_spec(host)["storage"]
    if storage["type"] != "nfs":
        pytest.skip(f"storage.type is {storage['type']}, not nfs")
    out = host.check_output(
        f"findmnt --noheadings --output FSTYPE,OPTIONS --mountpoint {storage['mountpoint']}"
    )
    fstype, options = out.split(None, 1)
    assert fstype.startswith("nfs")
    opts = options.split(",")
    assert "hard" in opts
    assert "rsize=1048576" in opts and "wsize=1048576" in opts


@pytest.mark.groups("compute")
def test_existing_mount_present(host: Any) -> None:
    storage = cluster_spec(host)["storage"]
    if storage["type"] != "existing":
        pytest.skip(f"storage.type is {storage['type']}, not existing")
    assert host.run(f"mountpoint -q {storage['mountpoint']}").rc == 0
