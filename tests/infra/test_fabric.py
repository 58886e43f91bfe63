"""HCA health (lcm_runner.health.fabric) on compute nodes: every HCA of cluster.fabric.hcas present,
port 1 Active/LinkUp on the fabric's link layer at >= fabric.rate_gbps, read from the node's sysfs (and
ibstat where it is installed). Skipped, with the reason, for an ethernet fabric (the lab).

Run: pytest tests/infra/test_fabric.py --hosts=ansible://all --ansible-inventory=inventories/<name>
"""

from __future__ import annotations

from typing import Any

import pytest
from conftest import cluster_spec

from lcm_runner.health.expect import FabricExpect
from lcm_runner.health.fabric import HcaPort, check_fabric, parse_ibstat, sysfs_word

pytestmark = pytest.mark.groups("compute")


@pytest.fixture
def fabric(host: Any) -> FabricExpect:
    f = cluster_spec(host)["fabric"]
    if f["type"] == "ethernet" or not f["hcas"]:
        pytest.skip(f"spec: fabric type {f['type']}, no HCAs")
    return FabricExpect(type=f["type"], hcas=tuple(f["hcas"]), rate_gbps=f["rate_gbps"], port=1)


def _sysfs_ports(host: Any, fabric: FabricExpect) -> dict[tuple[str, int], HcaPort]:
    ports = {}
    for hca in fabric.hcas:
        d = f"/sys/class/infiniband/{hca}/ports/{fabric.port}"
        if not host.file(d).is_directory:
            continue

        def read(name: str, d: str = d) -> str:
            return host.file(f"{d}/{name}").content_string.strip()

        rate = read("rate").split()[0]
        ports[(hca, fabric.port)] = HcaPort(
            hca,
            fabric.port,
            sysfs_word(read("state")),
            sysfs_word(read("phys_state")),
            float(rate),
            read("link_layer"),
        )
    return ports


def test_hcas_from_sysfs(host: Any, fabric: FabricExpect) -> None:
    checks = check_fabric(host.backend.get_hostname(), fabric, _sysfs_ports(host, fabric))
    assert [c.line() for c in checks if c.status == "fail"] == []


def test_hcas_from_ibstat(host: Any, fabric: FabricExpect) -> None:
    if not host.exists("ibstat"):
        pytest.skip("ibstat not installed (infiniband-diags)")
    checks = check_fabric(host.backend.get_hostname(), fabric, parse_ibstat(host.check_output("ibstat")))
    assert [c.line() for c in checks if c.status == "fail"] == []
