"""roles/slurmdbd and slurm.conf's accounting keys, rendered by Ansible's engine; the sacctmgr planner
(roles/slurmdbd/filter_plugins/sacctmgr.py) on real `sacctmgr -n -P` listings of the lab (Slurm 22.05.8)."""

from __future__ import annotations

import copy
import importlib.util
from typing import Any

import yaml
from _role_render import REPO, render

from lcm_runner.lock import release_lock

_spec = importlib.util.spec_from_file_location(
    "sacctmgr_filter", REPO / "roles/slurmdbd/filter_plugins/sacctmgr.py"
)
assert _spec and _spec.loader
sacctmgr = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sacctmgr)
_conf_spec = importlib.util.spec_from_file_location(
    "slurm_conf_filter_acct", REPO / "roles/slurm/filter_plugins/slurm_conf.py"
)
assert _conf_spec and _conf_spec.loader
slurm_conf = importlib.util.module_from_spec(_conf_spec)
_conf_spec.loader.exec_module(slurm_conf)

LAB = yaml.safe_load((REPO / "inventories/lab/group_vars/all/cluster.yml").read_text())["cluster"]
RESTART_KEYS = yaml.safe_load((REPO / "roles/slurm/vars/main.yml").read_text())["_slurm_restart_keys"]
LOCK = release_lock(yaml.safe_load((REPO / "versions.lock.yml").read_text())["lcm_lock"])["packages"]
DBD_VARS = yaml.safe_load((REPO / "roles/slurmdbd/vars/main.yml").read_text())


def _facts(host: str) -> dict[str, Any]:
    return {
        "ansible_hostname": host,
        "ansible_processor_vcpus": 2,
        "ansible_processor_count": 1,
        "ansible_processor_cores": 2,
        "ansible_processor_threads_per_core": 1,
        "ansible_memtotal_mb": 23000,
    }


def _vars(cluster: dict[str, Any], **extra: Any) -> dict[str, Any]:
    base = {
        "cluster": cluster,
        "groups": {"controller": ["ctl"], "compute": ["n1", "n2"], "login": [], "db": ["dbhost"]},
        "hostvars": {h: _facts(h) for h in ("ctl", "n1", "n2", "dbhost")},
        "inventory_hostname": "ctl",
        "ansible_hostname": "ctl",
    }
    base.update(extra)
    return base


def _entries(text: str) -> dict[str, list[str]]:
    return slurm_conf.slurm_conf_entries(text)


# ----------------------------------------------------------------------------- slurm.conf


def test_slurm_conf_points_at_slurmdbd_on_the_accounting_host() -> None:
    conf = _entries(render("slurm", "slurm.conf.j2", _vars(LAB)))
    assert conf["accountingstoragetype"] == ["AccountingStorageType=accounting_storage/slurmdbd"]
    assert conf["accountingstoragehost"] == ["AccountingStorageHost=ctl"]
    assert conf["accountingstorageport"] == ["AccountingStoragePort=6819"]
    assert conf["jobacctgathertype"] == ["JobAcctGatherType=jobacct_gather/linux"]
    assert conf["clustername"] == ["ClusterName=lab"]
    assert "accountingstoragetres" not in conf  # no GPUs in the lab


def test_slurm_conf_accounting_host_group_and_port_from_the_spec() -> None:
    spec = copy.deepcopy(LAB)
    spec["slurm"]["accounting"].update(host_group="db", port=7031)
    spec["gpu"].update(model="h200", count_per_node=8, gres_type="h200")
    conf = _entries(render("slurm", "slurm.conf.j2", _vars(spec)))
    assert conf["accountingstoragehost"] == ["AccountingStorageHost=dbhost"]
    assert conf["accountingstorageport"] == ["AccountingStoragePort=7031"]
    assert conf["accountingstoragetres"] == ["AccountingStorageTRES=gres/gpu"]


def test_slurm_conf_without_accounting() -> None:
    spec = copy.deepcopy(LAB)
    spec["slurm"]["accounting"]["enabled"] = False
    conf = _entries(render("slurm", "slurm.conf.j2", _vars(spec)))
    assert not [k for k in conf if k.startswith("accountingstorage")]
    assert conf["jobacctgathertype"] == ["JobAcctGatherType=jobacct_gather/none"]


def test_turning_accounting_on_restarts_the_daemons() -> None:
    """slurmctld loads its accounting_storage plugin at start: scontrol reconfigure would not switch it."""
    off = copy.deepcopy(LAB)
    off["slurm"]["accounting"]["enabled"] = False
    before = render("slurm", "slurm.conf.j2", _vars(off))
    after = render("slurm", "slurm.conf.j2", _vars(LAB))
    changed = slurm_conf.slurm_restart_keys_changed(before, after, RESTART_KEYS)
    assert {
        "AccountingStorageType",
        "AccountingStorageHost",
        "AccountingStoragePort",
        "JobAcctGatherType",
    } <= set(changed)
    assert slurm_conf.slurm_restart_keys_changed(after, after, RESTART_KEYS) == []


# ----------------------------------------------------------------------------- slurmdbd.conf, MariaDB


def _dbd_conf(**extra: Any) -> str:
    return render(
        "slurmdbd", "slurmdbd.conf.j2", _vars(LAB, _slurmdbd_db_password="s3cr3t-pw-for-test", **extra)
    )


def test_slurmdbd_conf() -> None:
    lines = [ln for ln in _dbd_conf().splitlines() if ln and not ln.startswith("#")]
    assert lines == [
        "AuthType=auth/munge",
        "DbdHost=ctl",
        "DbdPort=6819",
        "SlurmUser=slurm",
        "LogFile=/var/log/slurm/slurmdbd.log",
        "PidFile=/run/slurmdbd.pid",
        "StorageType=accounting_storage/mysql",
        "StorageHost=localhost",
        "StorageLoc=slurm_acct_db",
        "StorageUser=slurm",
        "StoragePass=s3cr3t-pw-for-test",
    ]


def test_slurmdbd_conf_purge() -> None:
    text = _dbd_conf(slurmdbd_purge_after_months=12)
    purge = [ln for ln in text.splitlines() if ln.startswith("Purge")]
    assert len(purge) == 7 and all(ln.endswith("After=12months") for ln in purge), purge
    assert "PurgeJobAfter=12months" in purge
    assert not [ln for ln in _dbd_conf().splitlines() if ln.startswith("Purge")]


def test_mariadb_settings_listen_on_localhost() -> None:
    text = render("slurmdbd", "90-lcm-slurmdbd.cnf.j2", _vars(LAB))
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert lines == [
        "[mysqld]",
        "bind-address = 127.0.0.1",
        "innodb_buffer_pool_size = 1024M",
        "innodb_log_file_size = 64M",
        "innodb_lock_wait_timeout = 900",
    ]


def test_slurmdbd_packages_are_pinned_at_the_nodes_slurm_release() -> None:
    for name in DBD_VARS["_slurmdbd_slurm_packages"]:
        assert LOCK[name] == LOCK["slurm-client"], name
    for name in DBD_VARS["_slurmdbd_mariadb_packages"]:
        assert name in LOCK, name
    assert LOCK["mariadb-server"] == LOCK["mariadb-client"]


def test_password_tasks_hide_it_and_keep_the_files_private() -> None:
    tasks = yaml.safe_load((REPO / "roles/slurmdbd/tasks/configure.yml").read_text())
    secret = ("slurmdbd_storage_password", "_slurmdbd_password.", "urandom")
    touching = [
        t for t in tasks if any(m in str(t) for m in secret) or t.get("register") == "_slurmdbd_password"
    ]
    assert len(touching) >= 6, [t["name"] for t in touching]
    assert all(t.get("no_log") is True for t in touching), [
        t["name"] for t in touching if not t.get("no_log")
    ]
    conf = next(t for t in tasks if t["name"].startswith("Install slurmdbd.conf"))
    assert conf["ansible.builtin.template"]["mode"] == "0600"
    assert conf["ansible.builtin.template"]["owner"] == "slurm"
    for t in tasks:
        for module in ("ansible.builtin.copy", "ansible.builtin.file"):
            if "_slurmdbd_password_path" in str(t.get(module, {})):
                assert t[module]["mode"] == "0600" and t[module]["owner"] == "root", t["name"]


# ----------------------------------------------------------------------------- sacctmgr planner

# `sacctmgr -n -P list account format=Account,Descr,Org` and `... list association cluster=lab
# format=Account,User,ParentName` on the lab (Slurm 22.05.8) right after slurmctld registered the cluster,
# and after the converge added the lab spec's accounts (descriptions come back lowercased).
FRESH_ACCOUNTS = "root|default root account|root\n"
FRESH_ASSOCS = "root||\nroot|root|\n"
DONE_ACCOUNTS = (
    "lcm|lcm-infra training runs|lcm\nlcm-ci|lab and ci jobs|lcm\nroot|default root account|root\n"
)
DONE_ASSOCS = "root||\nroot|root|\nlcm||root\nlcm|root|\nlcm-ci||lcm\nlcm-ci|root|\n"
SPEC_ACCOUNTS = LAB["slurm"]["accounting"]["accounts"]


def _plan(accounts: str, assocs: str, spec: list[dict[str, Any]] | None = None) -> list[list[str]]:
    return [
        c["argv"] for c in sacctmgr.slurmdbd_account_commands(accounts, assocs, spec or SPEC_ACCOUNTS, "lab")
    ]


def test_fresh_database_gets_accounts_parent_first_then_users() -> None:
    assert _plan(FRESH_ACCOUNTS, FRESH_ASSOCS) == [
        [
            "sacctmgr",
            "-i",
            "add",
            "account",
            "lcm",
            "cluster=lab",
            "parent=root",
            "description=lcm-infra training runs",
        ],
        [
            "sacctmgr",
            "-i",
            "add",
            "account",
            "lcm-ci",
            "cluster=lab",
            "parent=lcm",
            "description=lab and CI jobs",
        ],
        ["sacctmgr", "-i", "add", "user", "root", "account=lcm", "cluster=lab"],
        ["sacctmgr", "-i", "add", "user", "root", "account=lcm-ci", "cluster=lab"],
    ]


def test_converged_database_needs_nothing() -> None:
    """The second converge reports changed=0: nothing to run (descriptions compared without case)."""
    assert _plan(DONE_ACCOUNTS, DONE_ASSOCS) == []


def test_changed_description_parent_and_new_user() -> None:
    spec = copy.deepcopy(SPEC_ACCOUNTS)
    spec[1].update(description="nightly CI", parent="root", organization="lcm")
    spec[0]["users"] = ["root", "alice"]
    assert _plan(DONE_ACCOUNTS, DONE_ASSOCS, spec) == [
        ["sacctmgr", "-i", "modify", "account", "where", "name=lcm-ci", "set", "description=nightly CI"],
        ["sacctmgr", "-i", "modify", "account", "where", "name=lcm-ci", "cluster=lab", "set", "parent=root"],
        ["sacctmgr", "-i", "add", "user", "alice", "account=lcm", "cluster=lab"],
    ]


def test_accounts_not_in_the_spec_are_left_alone() -> None:
    assert _plan(DONE_ACCOUNTS + "old|old|old\n", DONE_ASSOCS + "old||root\nold|bob|\n") == []
