"""roles/rdma: port-check filters, and the role's preflight/verify task files run for real on localhost
(this machine has no HCA: its real /sys/bus/pci for the preflight, sysfs trees in tmp for the port checks)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import yaml
from _role_run import IB_FABRIC, REPO, run_role, spec

from lcm_runner.spec import validate

_spec = importlib.util.spec_from_file_location(
    "rdma_checks", REPO / "roles/rdma/filter_plugins/rdma_checks.py"
)
assert _spec and _spec.loader
rc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rc)

NDR = {
    "rate": "400 Gb/sec (4X NDR)",
    "state": "4: ACTIVE",
    "phys_state": "5: LinkUp",
    "link_layer": "InfiniBand",
}
HCAS = IB_FABRIC["hcas"]


def _lines(ports: dict[str, dict[str, str]]) -> list[str]:
    return [f"{hca} 1 {a} {v}" for hca, attrs in ports.items() for a, v in attrs.items()]


def test_healthy_ndr_ports_pass():
    assert rc.port_problems(_lines({h: NDR for h in HCAS}), HCAS, 400, "infiniband") == []


def test_each_problem_names_the_hca():
    ports = {h: dict(NDR) for h in HCAS[:7]}
    ports["mlx5_3"]["rate"] = "200 Gb/sec (4X HDR)"
    ports["mlx5_5"] |= {"state": "1: DOWN", "phys_state": "3: Disabled"}
    problems = rc.port_problems(_lines(ports), HCAS, 400, "infiniband")
    assert problems == [
        "mlx5_3 port 1: rate 200 Gb/sec (4X HDR), the spec says fabric.rate_gbps=400",
        "mlx5_5 port 1: state 1: DOWN (phys_state 3: Disabled), expected ACTIVE",
        "mlx5_7: not present (RDMA devices on this node: " + ", ".join(HCAS[:7]) + ")",
    ]


def test_roce_needs_ethernet_link_layer_and_zero_rate_is_unchecked():
    problems = rc.port_problems(_lines({"mlx5_0": NDR}), ["mlx5_0"], 0, "roce")
    assert problems == ["mlx5_0 port 1: link layer InfiniBand, fabric.type=roce needs Ethernet"]


def test_mellanox_pci_count():
    lines = ["0000:01:00.0 0x15b3 0x020700", "0000:01:00.1 0x15b3 0x020000", "0000:02:00.0 0x15b3 0x080000"]
    assert rc.mellanox_pci_count([*lines, "0000:03:00.0 0x8086 0x020000"]) == 2


def _ib_tree(tmp_path: Path, ports: dict[str, dict[str, str]]) -> Path:
    """A /sys/class/infiniband tree: <hca>/ports/1/{rate,state,phys_state,link_layer}."""
    root = tmp_path / "infiniband"
    for hca, attrs in ports.items():
        port = root / hca / "ports" / "1"
        port.mkdir(parents=True)
        for name, value in attrs.items():
            (port / name).write_text(value + "\n")
    return root


def _verify(tmp_path: Path, tree: Path, fabric: dict = IB_FABRIC):
    return run_role(
        "rdma",
        tmp_path,
        {"cluster": spec(fabric=fabric), "_rdma_sysfs": str(tree), "rdma_port_wait_s": 0},
        tasks_from="verify",
    )


def test_verify_passes_on_healthy_hcas(tmp_path):
    run = _verify(tmp_path, _ib_tree(tmp_path, {h: NDR for h in HCAS}))
    assert run.rc == 0, run.failed_msgs or run.stderr[-2000:]


def test_verify_fails_naming_the_hca_and_its_rate(tmp_path):
    ports = {h: dict(NDR) for h in HCAS}
    ports["mlx5_6"]["rate"] = "200 Gb/sec (4X HDR)"
    run = _verify(tmp_path, _ib_tree(tmp_path, ports))
    assert run.rc != 0
    assert (
        "localhost: mlx5_6 port 1: rate 200 Gb/sec (4X HDR), the spec says fabric.rate_gbps=400"
        in run.failed_msgs
    )


def test_preflight_fails_without_adapters_on_this_machine(tmp_path):
    run = run_role("rdma", tmp_path, {"cluster": spec(fabric=IB_FABRIC)}, tags="rdma_preflight")
    assert run.rc != 0
    msg = " ".join(run.failed_msgs)
    assert "cluster.fabric.hcas lists 8 HCAs (mlx5_0, mlx5_1" in msg
    assert "localhost has 0 Mellanox/NVIDIA network PCI functions" in msg


def test_an_ethernet_fabric_with_the_rdma_layer_is_refused_by_validation():
    """The spec mistake is validation's (before any host is contacted); the preflight checks the host."""
    cluster = yaml.safe_load((REPO / "inventories/lab/group_vars/all/cluster.yml").read_text())["cluster"]
    cluster["layers"]["rdma"] = True
    cluster["fabric"]["type"] = "ethernet"
    groups = {
        "controller": ["ctl"],
        "compute": ["node1"],
        "monitoring": ["ctl"],
        "cluster": ["ctl", "node1"],
        "all": ["ctl", "node1"],
    }
    assert [str(e) for e in validate(cluster, groups)] == [
        "cluster.layers.rdma = true: expected false for fabric type ethernet"
    ]
