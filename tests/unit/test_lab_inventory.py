"""inventories/lab/hosts.py: the lab inventory (groups contract, node count, addresses, bad settings)."""

from __future__ import annotations

import importlib.util
import ipaddress
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "inventories" / "lab" / "hosts.py"
_spec = importlib.util.spec_from_file_location("lab_hosts", SCRIPT)
assert _spec and _spec.loader
hosts = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hosts)

SETTINGS = {"lab_compute_nodes": "2", "lab_network_subnet": "10.89.42.0/24", "lab_ip_offset": "10"}


def test_groups_contract() -> None:
    inv = hosts.build(SETTINGS, Path("/x/.lab/ssh"))
    assert inv["lab_host"]["hosts"] == ["localhost"]
    assert inv["controller"]["hosts"] == ["lab-ctl"]
    assert inv["monitoring"]["hosts"] == ["lab-ctl"]
    assert inv["compute"]["hosts"] == ["lab-node1", "lab-node2"]
    assert inv["login"]["hosts"] == []
    assert set(inv["cluster"]["children"]) == {"controller", "compute", "monitoring", "login"}
    assert "cluster" in inv["all"]["children"] and "lab_host" in inv["all"]["children"]


def test_addresses_are_fixed_and_inside_the_subnet() -> None:
    inv = hosts.build({**SETTINGS, "lab_compute_nodes": "5"}, Path("/x/.lab/ssh"))
    hv = inv["_meta"]["hostvars"]
    net = ipaddress.ip_network(SETTINGS["lab_network_subnet"])
    ips = [hv[n]["ansible_host"] for n in ["lab-ctl"] + [f"lab-node{i}" for i in range(1, 6)]]
    assert ips == [f"10.89.42.{i}" for i in range(10, 16)]
    assert all(ipaddress.ip_address(ip) in net for ip in ips)
    assert hv["lab-node3"]["ansible_ssh_private_key_file"] == "/x/.lab/ssh/id_ed25519"
    assert "UserKnownHostsFile=/x/.lab/ssh/known_hosts" in hv["lab-node3"]["ansible_ssh_common_args"]
    assert "StrictHostKeyChecking=yes" in hv["lab-node3"]["ansible_ssh_common_args"]
    assert hv["localhost"]["ansible_connection"] == "local"
    # every host gives Slurm its address (NodeAddr, SlurmctldHost=name(addr)): podman's DNS forgets names
    assert [hv[n]["slurm_node_addr"] for n in ["lab-ctl"] + [f"lab-node{i}" for i in range(1, 6)]] == ips
    # every container's /etc/hosts: the whole address plan, the same whatever the node count
    table = hv["localhost"]["lab_hosts_table"]
    assert [table[n] for n in ["lab-ctl"] + [f"lab-node{i}" for i in range(1, 6)]] == ips
    assert len(table) == 2 * (1 + hosts.MAX_NODES) and table["lab-node32"] == "10.89.42.42"
    assert table["lab-node3.v4mapped"] == "::ffff:10.89.42.13"  # torch's sockets: IPv4-mapped IPv6
    assert table == hosts.build(SETTINGS, Path("/x"))["_meta"]["hostvars"]["localhost"]["lab_hosts_table"]
    # a plan near the end of the subnet stops at .254
    near_end = hosts.build({**SETTINGS, "lab_ip_offset": "240"}, Path("/x"))["_meta"]["hostvars"]["localhost"]
    assert (
        near_end["lab_hosts_table"]["lab-node14"] == "10.89.42.254"
        and "lab-node15" not in near_end["lab_hosts_table"]
    )


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"lab_compute_nodes": "0"}, "integer 1..32"),
        ({"lab_compute_nodes": "two"}, "integer 1..32"),
        ({"lab_network_subnet": "8.8.8.0/24"}, "private IPv4 /24"),
        ({"lab_network_subnet": "10.0.0.0/16"}, "private IPv4 /24"),
        ({"lab_network_subnet": "nonsense"}, "lab_network_subnet"),
        ({"lab_ip_offset": "250", "lab_compute_nodes": "8"}, "lab_ip_offset"),
    ],
)
def test_bad_settings_are_refused(override: dict[str, str], message: str) -> None:
    with pytest.raises(hosts.InventoryError, match=message):
        hosts.build({**SETTINGS, **override}, Path("/x"))


def test_env_overrides_the_count_and_missing_keys_are_named(tmp_path: Path) -> None:
    lab = tmp_path / "lab.yml"
    lab.write_text("lab_compute_nodes: 2\nlab_network_subnet: 10.1.2.0/24\nlab_ip_offset: 20\n")
    assert hosts.read_settings(lab, {"LAB_COMPUTE_NODES": "3"})["lab_compute_nodes"] == "3"
    lab.write_text("lab_compute_nodes: 2\n")
    with pytest.raises(hosts.InventoryError, match="lab_network_subnet"):
        hosts.read_settings(lab, {})


def test_script_cli_lists_the_repo_settings() -> None:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--list"], capture_output=True, text=True, check=True, env={"PATH": ""}
    )
    inv = json.loads(out.stdout)
    assert inv["controller"]["hosts"] == ["lab-ctl"]
    bad = subprocess.run(
        [sys.executable, str(SCRIPT), "--list"],
        capture_output=True,
        text=True,
        check=False,
        env={"LAB_COMPUTE_NODES": "99"},
    )
    assert bad.returncode == 1 and "LAB_COMPUTE_NODES" in bad.stderr
