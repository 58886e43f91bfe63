"""shared_storage role (the NFS path the lab cannot run: no kernel NFS server in unprivileged
containers): the export and nfsd settings rendered by Ansible's engine, the client/server split and the
mount options, from a spec with storage.type nfs."""

from __future__ import annotations

import copy

import yaml
from _role_render import REPO, evaluate, render

LAB = yaml.safe_load((REPO / "inventories/lab/group_vars/all/cluster.yml").read_text())["cluster"]


def _vars(nfs: dict | None = None, host: str = "ctl") -> dict:
    spec = copy.deepcopy(LAB)
    spec["storage"].update(type="nfs", mountpoint="/shared", checkpoint_dir="/shared/checkpoints")
    if nfs is not None:
        spec["storage"]["nfs"] = nfs
    return {
        "cluster": spec,
        "groups": {"controller": ["ctl"], "compute": ["n1", "n2"], "login": ["login1"]},
        "hostvars": {
            "ctl": {"ansible_host": "10.0.0.1"},
            "n1": {"ansible_host": "10.0.0.11"},
            "n2": {"ansible_host": "10.0.0.12"},
            "login1": {"ansible_host": "10.0.0.5"},
        },
        "inventory_hostname": host,
    }


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def test_export_lists_every_client_with_options() -> None:
    lines = _lines(render("shared_storage", "lcm.exports.j2", _vars()))
    opts = "rw,sync,no_subtree_check,no_root_squash"
    assert lines == [f"/srv/lcm-shared 10.0.0.11({opts}) 10.0.0.12({opts}) 10.0.0.5({opts})"]


def test_export_path_and_options_from_spec() -> None:
    nfs = {"export_path": "/data/ckpt", "export_options": "rw,async,no_subtree_check", "threads": 64}
    lines = _lines(render("shared_storage", "lcm.exports.j2", _vars(nfs)))
    assert lines[0].startswith("/data/ckpt 10.0.0.11(rw,async,no_subtree_check) ")
    conf = _lines(render("shared_storage", "nfs.conf.j2", _vars(nfs)))
    assert conf == ["[nfsd]", "threads=64", "vers3=n", "vers4.2=y"]


def test_default_mount_options_suit_large_sequential_writes() -> None:
    opts = str(evaluate("shared_storage", "shared_storage_nfs_mount_options", _vars())).split(",")
    for want in ("hard", "rsize=1048576", "wsize=1048576", "nconnect=8", "noatime", "_netdev"):
        assert want in opts
    assert "soft" not in opts


def test_server_and_client_roles() -> None:
    assert evaluate("shared_storage", "_shared_storage_is_server", _vars(host="ctl")) is True
    assert evaluate("shared_storage", "_shared_storage_is_client", _vars(host="ctl")) is False
    assert list(evaluate("shared_storage", "_shared_storage_packages", _vars(host="ctl"))) == [
        "nfs-kernel-server",
        "nfs-common",
    ]
    assert evaluate("shared_storage", "_shared_storage_is_client", _vars(host="n1")) is True
    assert list(evaluate("shared_storage", "_shared_storage_packages", _vars(host="n1"))) == ["nfs-common"]
    # A storage group other than the controller serves the export.
    variables = _vars({"server_group": "storage"}, host="ctl")
    variables["groups"]["storage"] = ["stor1"]
    assert evaluate("shared_storage", "_shared_storage_is_server", variables) is False


def test_lab_shared_installs_nothing() -> None:
    variables = {**_vars(host="n1"), "cluster": LAB}
    assert list(evaluate("shared_storage", "_shared_storage_packages", variables)) == []
    assert (
        evaluate("shared_storage", "_shared_storage_is_server", {**variables, "inventory_hostname": "ctl"})
        is False
    )
