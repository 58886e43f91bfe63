"""Shared helpers for the testinfra layer tests (tests/infra/test_<layer>.py).

Run against any inventory:
    pytest tests/infra --hosts=ansible://all --ansible-inventory=inventories/<name>

Every test that uses the `host` fixture runs only on hosts of the `cluster` group unless it says otherwise
with `@pytest.mark.groups("compute", "login")` (any of the named groups) — so the lab's `lab_host`
(localhost) and other non-node hosts are skipped cleanly. Helpers:
    host_vars(host)                 the inventory variables of the host (group_vars included)
    host_groups(host)               the host's groups (set)
    cluster_spec(host)              the `cluster` spec mapping the roles read
    role_var(host, role, name)      an inventory override of a role variable, else the role default
    in_container(host)              the node is a container (some kernel settings cannot apply there)
    lock_for(host)                  versions.lock.yml's lcm_lock as the roles see it on the host (its release)
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ROLES = REPO / "roles"
DEFAULT_GROUPS = ("cluster",)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "groups(*names): run only on hosts in any of these inventory groups (default: cluster)"
    )


def host_vars(host: Any) -> dict[str, Any]:
    """Inventory variables of the host (testinfra's Ansible backend reads them from ansible-inventory)."""
    return host.ansible.get_variables()


def host_groups(host: Any) -> set[str]:
    return set(host_vars(host).get("group_names", []))


def cluster_spec(host: Any) -> dict[str, Any]:
    spec = host_vars(host).get("cluster")
    if not isinstance(spec, dict):
        pytest.fail(f"{host.backend.get_hostname()}: no `cluster` spec in the inventory variables")
    from lcm_runner.spec.schema import fill_defaults  # what validate.yml hands the roles

    return fill_defaults(spec)


@functools.cache
def role_defaults(role: str) -> dict[str, Any]:
    path = ROLES / role / "defaults" / "main.yml"
    return yaml.safe_load(path.read_text(encoding="utf-8")) or {}


def role_var(host: Any, role: str, name: str) -> Any:
    """The value a role sees for a plain (non-templated) public variable: inventory override or default."""
    variables = host_vars(host)
    if name in variables:
        return variables[name]
    defaults = role_defaults(role)
    if name not in defaults:
        raise KeyError(f"{role} has no default for {name}")
    return defaults[name]


def in_container(host: Any) -> bool:
    return host.file("/run/.containerenv").exists or host.file("/.dockerenv").exists


def lcm_fact(host: Any) -> dict[str, Any]:
    """The node fact roles/common installs, computed now on the node."""
    return json.loads(host.check_output("/etc/ansible/facts.d/lcm.fact"))


def _is_ansible_host(host: Any) -> bool:
    return type(host.backend).__name__ == "AnsibleBackend"


@pytest.fixture(autouse=True)
def _only_on_matching_groups(request: pytest.FixtureRequest) -> None:
    if "host" not in request.fixturenames:
        return
    host = request.getfixturevalue("host")
    if not _is_ansible_host(host):
        return
    marker = request.node.get_closest_marker("groups")
    wanted = tuple(marker.args) if marker else DEFAULT_GROUPS
    groups = host_groups(host)
    if not groups.intersection(wanted):
        pytest.skip(f"{host.backend.get_hostname()} is not in {'/'.join(wanted)}")


@functools.cache
def _raw_lock() -> dict[str, Any]:
    return yaml.safe_load((REPO / "versions.lock.yml").read_text(encoding="utf-8"))["lcm_lock"]


def lock_for(host: Any) -> dict[str, Any]:
    """lcm_lock with packages = the pins of the host's Debian release (what lcm_lock.packages is there)."""
    from lcm_runner.lock import release_lock

    return release_lock(_raw_lock(), host.system_info.codename)
