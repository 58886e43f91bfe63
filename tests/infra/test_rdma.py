"""Fabric layer (roles/rdma) on compute nodes: the RDMA userspace installed (pinned, held for the inbox
stack) and every spec HCA ACTIVE at the spec's rate. Skipped where the spec's layers.rdma is off (the lab).

Run: pytest tests/infra/test_rdma.py --hosts=ansible://all --ansible-inventory=inventories/<name>
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
from conftest import REPO, cluster_spec, lock_for, role_var

_spec = importlib.util.spec_from_file_location(
    "rdma_checks", REPO / "roles/rdma/filter_plugins/rdma_checks.py"
)
assert _spec and _spec.loader
rc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rc)

pytestmark = pytest.mark.groups("compute")


@pytest.fixture
def spec(host: Any) -> dict[str, Any]:
    spec = cluster_spec(host)
    if not spec["layers"].get("rdma", False):
        pytest.skip("cluster.layers.rdma is off")
    return spec


def test_inbox_packages_pinned_and_held(host: Any, spec: dict[str, Any]) -> None:
    if role_var(host, "rdma", "rdma_stack") != "inbox":
        pytest.skip("DOCA-OFED stack")
    for name in role_var(host, "rdma", "rdma_inbox_packages"):
        version, status = host.check_output("dpkg-query -W -f='${Version}|${Status}' %s", name).split("|")
        pinned = lock_for(host)["packages"][name]
        assert version == pinned and status == "hold ok installed", (name, version, status)


def test_hcas_active_at_spec_rate(host: Any, spec: dict[str, Any]) -> None:
    out = host.check_output(
        "for p in /sys/class/infiniband/*/ports/*; do"
        " h=$(basename $(dirname $(dirname $p))); n=$(basename $p);"
        ' for a in rate state phys_state link_layer; do echo "$h $n $a $(cat $p/$a)"; done; done'
    )
    fabric = spec["fabric"]
    assert (
        rc.port_problems(out.splitlines(), fabric["hcas"], fabric.get("rate_gbps", 0), fabric["type"]) == []
    )


def test_ibstat_lists_the_hcas(host: Any, spec: dict[str, Any]) -> None:
    listed = set(host.check_output("ibstat -l").split())
    assert set(spec["fabric"]["hcas"]) <= listed
