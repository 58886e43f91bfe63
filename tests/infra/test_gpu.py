"""GPU health (lcm_runner.health) on compute nodes: nvidia-smi -q -x, topo -m, nvlink -s and the kernel
log, fetched from the node and checked against the spec the way `lcm-runner health check` does
(docs/health.md). Skipped, with the reason, where the spec has no GPUs (the lab).

Run: pytest tests/infra/test_gpu.py --hosts=ansible://all --ansible-inventory=inventories/<name>
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import cluster_spec

from lcm_runner.health.expect import GpuExpect
from lcm_runner.health.gpu import check_gpus, parse_xml
from lcm_runner.health.topo import check_nvlink, check_topo, parse_nvlink, parse_topo
from lcm_runner.health.xid import check_xids

pytestmark = pytest.mark.groups("compute")
EXPECT = "/etc/lcm/node-health.json"


@pytest.fixture
def gpu(host: Any) -> GpuExpect:
    spec = cluster_spec(host)
    g = spec["gpu"]
    if g["count_per_node"] == 0:
        pytest.skip("spec: no GPUs (cluster.gpu.count_per_node is 0)")
    driver = ""
    if host.file(EXPECT).exists:  # roles/node_health's rendering of the lock's driver version
        driver = json.loads(host.file(EXPECT).content_string)["gpu"]["driver"]
    h = spec["health"]
    return GpuExpect(
        model=g["model"],
        count=g["count_per_node"],
        driver=driver,
        pcie_gen=h["pcie_gen"],
        pcie_width=h["pcie_width"],
        nvlink=g["nvlink"] or g["nvswitch"],
        nvswitch=g["nvswitch"],
        fabric_manager=g["nvswitch"],
        xid_ignore=tuple(h["xid_ignore"]),
    )


def _failed(checks: list[Any]) -> list[str]:
    return [c.line() for c in checks if c.status == "fail"]


def test_gpu_state(host: Any, gpu: GpuExpect) -> None:
    log = parse_xml(host.check_output("nvidia-smi -q -x"))
    assert _failed(check_gpus(host.backend.get_hostname(), gpu, log)) == []


def test_nvlink_topology(host: Any, gpu: GpuExpect) -> None:
    if not gpu.nvlink:
        pytest.skip("spec: gpu.nvlink and gpu.nvswitch false (no NVLink expected)")
    node = host.backend.get_hostname()
    topo = check_topo(node, gpu, parse_topo(host.check_output("nvidia-smi topo -m")))
    if topo.status == "skip":
        pytest.skip(topo.reason)
    links = check_nvlink(node, gpu, parse_nvlink(host.check_output("nvidia-smi nvlink -s")))
    assert _failed([topo, links]) == []


def test_no_xid_in_kernel_log(host: Any, gpu: GpuExpect) -> None:
    with host.sudo():
        out = host.run("dmesg")
    if out.rc != 0:
        pytest.skip(f"kernel log unreadable: {out.stderr.strip()}")
    c = check_xids(host.backend.get_hostname(), gpu, out.stdout)
    assert c.status == "pass", c.line()
