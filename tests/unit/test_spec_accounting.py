"""cluster.slurm.accounting in the spec: defaults, and each bad value refused in validation (before any
host changes) with a message naming the field, the value and what is expected; the lock needs slurmdbd
and MariaDB exactly when accounting is on."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from lcm_runner.lock import release_lock
from lcm_runner.spec import fill_defaults, load_cluster, validate

ROOT = Path(__file__).resolve().parents[2]
LAB = load_cluster(ROOT / "inventories/lab")
H200 = load_cluster(ROOT / "inventories/example-h200")
LOCK = release_lock(yaml.safe_load((ROOT / "versions.lock.yml").read_text())["lcm_lock"])
GROUPS = {"all": ["ctl", "c1", "c2"], "controller": ["ctl"], "compute": ["c1", "c2"], "monitoring": ["ctl"]}
A = "cluster.slurm.accounting"
DBD_PACKAGES = {"slurmdbd", "slurm-wlm-mysql-plugin", "mariadb-server", "mariadb-client", "python3-pymysql"}


def _spec(**accounting: Any) -> dict[str, Any]:
    spec = copy.deepcopy(LAB)
    spec["slurm"]["accounting"] = {**spec["slurm"]["accounting"], **accounting}
    return spec


def _msgs(spec: dict[str, Any], groups: dict[str, list[str]] | None = None) -> list[str]:
    return [str(e) for e in validate(spec, GROUPS if groups is None else groups)]


def test_defaults_turn_accounting_on_on_the_controller() -> None:
    spec = copy.deepcopy(H200)
    assert "accounting" not in spec["slurm"]
    acct = fill_defaults(spec)["slurm"]["accounting"]
    assert acct == {"enabled": True, "host_group": "controller", "port": 6819, "accounts": []}
    lab = fill_defaults(LAB)["slurm"]["accounting"]["accounts"]
    assert lab[1] == {
        "name": "lcm-ci",
        "parent": "lcm",
        "description": "lab and CI jobs",
        "organization": "",
        "users": ["root"],
    }
    assert validate(LAB, GROUPS, LOCK) == []


@pytest.mark.parametrize(
    ("accounting", "expected"),
    [
        (
            {"accounts": [{"name": "root"}]},
            f'{A}.accounts[0].name = "root": expected an account name other than root',
        ),
        (
            {"accounts": [{"name": "a"}, {"name": "a"}]},
            f"{A}.accounts[1].name = \"a\": expected a unique account name ('a' is listed before)",
        ),
        (
            {"accounts": [{"name": "b", "parent": "a"}, {"name": "a"}]},
            f'{A}.accounts[0].parent = "a": expected root or an account listed before this one (known: root)',
        ),
        (
            {"accounts": [{"name": "a", "parent": "a"}]},
            f'{A}.accounts[0].parent = "a": expected another account than the account itself',
        ),
        (
            {"accounts": [{"name": "GPU"}]},
            f'{A}.accounts[0].name = "GPU": expected a string matching ^[a-z][a-z0-9_-]{{0,63}}$',
        ),
        (
            {"accounts": [{"name": "a", "users": ["bob", "bob"]}]},
            f'{A}.accounts[0].users = ["bob", "bob"]: expected unique items (\'bob\' appears twice)',
        ),
        (
            {"accounts": [{"name": "a", "users": ["bob; rm -rf /"]}]},
            f'{A}.accounts[0].users[0] = "bob; rm -rf /": expected a string matching',
        ),
        (
            {"accounts": [{"name": "a", "description": 'x"; drop'}]},
            f'{A}.accounts[0].description = "x\\"; drop": expected a string matching',
        ),
        ({"port": 80}, f"{A}.port = 80: expected a number >= 1024"),
        (
            {"accounts": [{"name": "a", "user": ["x"]}]},
            f'{A}.accounts[0].user = ["x"]: expected no such field',
        ),
        (
            {"enable": True},
            f"{A}.enable = true: expected no such field (unknown key; known: enabled,",
        ),
    ],
)
def test_bad_accounting_is_refused_with_a_specific_message(accounting: dict[str, Any], expected: str) -> None:
    msgs = _msgs(_spec(**accounting))
    assert any(m.startswith(expected) for m in msgs), msgs
    assert len(msgs) == 1, msgs


@pytest.mark.parametrize(
    ("host_group", "groups", "expected"),
    [
        (
            "db",
            GROUPS,
            f'{A}.host_group = "db": expected an inventory group with exactly 1 host (known: '
            "compute, controller, monitoring)",
        ),
        (
            "db",
            {**GROUPS, "db": ["d1", "d2"]},
            f'{A}.host_group = "db": expected a group with exactly 1 host: one slurmdbd (found 2: d1, d2)',
        ),
        (
            "db",
            {**GROUPS, "db": []},
            f'{A}.host_group = "db": expected a group with exactly 1 host: one slurmdbd (found 0: none)',
        ),
        (
            "compute1",
            {**GROUPS, "compute1": ["c1"]},
            f'{A}.host_group = "compute1": expected a group whose host is not a compute host (c1 '
            "is in compute",
        ),
    ],
)
def test_bad_host_group_is_refused(host_group: str, groups: dict[str, list[str]], expected: str) -> None:
    msgs = _msgs(_spec(host_group=host_group), groups)
    assert [m for m in msgs if m.startswith(expected)], msgs
    assert len(msgs) == 1, msgs


def test_a_dedicated_accounting_host_is_fine() -> None:
    assert _msgs(_spec(host_group="db"), {**GROUPS, "db": ["dbhost"]}) == []


def test_host_group_is_not_checked_when_accounting_or_slurm_is_off() -> None:
    assert _msgs(_spec(enabled=False, host_group="nope")) == []
    spec = _spec(host_group="nope")
    spec["layers"].update(slurm=False, pyxis=False)
    assert _msgs(spec) == []


def test_lock_needs_slurmdbd_and_mariadb_only_with_accounting() -> None:
    lock = copy.deepcopy(LOCK)
    for name in DBD_PACKAGES:
        del lock["packages"][name]
    msgs = [str(e) for e in validate(LAB, GROUPS, lock)]
    missing = {m.split(" = ")[0].removeprefix("lcm_lock.packages.") for m in msgs}
    assert missing == DBD_PACKAGES, msgs
    assert all("cluster.layers.slurm is true and installs it from the lock" in m for m in msgs)
    assert validate(_spec(enabled=False), GROUPS, lock) == []


def test_lock_slurmdbd_is_the_slurm_release_and_mariadb_one_release() -> None:
    lock = copy.deepcopy(LOCK)
    lock["packages"]["slurmdbd"] = "23.02.6-1"
    lock["packages"]["mariadb-client"] = "1:10.11.6-0+deb12u1"
    msgs = [str(e) for e in validate(LAB, GROUPS, lock)]
    assert msgs == [
        'lcm_lock.packages.slurmdbd = "23.02.6-1": expected version 22.05.8-4+deb12u3 like '
        "lcm_lock.packages.slurm-client (slurmdbd is the Slurm release of the nodes)",
        'lcm_lock.packages.mariadb-client = "1:10.11.6-0+deb12u1": expected version 1:10.11.18-0+deb12u1 '
        "like lcm_lock.packages.mariadb-server (the MariaDB server and its client are one release)",
    ]
