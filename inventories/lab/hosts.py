#!/usr/bin/env python3
"""Dynamic inventory of the podman lab (docs/lab.md).

The number of compute nodes is one variable: `lab_compute_nodes` in group_vars/all/lab.yml, overridden by
the environment variable LAB_COMPUTE_NODES. Groups (a contract other layers rely on):
  lab_host   the machine that runs the containers (localhost; only the lab inventory has it)
  cluster    parent of every node: controller, compute, monitoring, login
  controller exactly one node (lab-ctl), also the monitoring node
  compute    lab-node1 .. lab-nodeN
  login      empty in the lab
Nodes are reached over SSH at fixed IPs of the lab network, with the key and host key the lab role makes
under <repo>/.lab/ssh/.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import sys
from pathlib import Path

INVENTORY_DIR = Path(__file__).resolve().parent
REPO = INVENTORY_DIR.parent.parent
LAB_VARS = INVENTORY_DIR / "group_vars" / "all" / "lab.yml"
SSH_DIR = REPO / ".lab" / "ssh"
MAX_NODES = 32
_LINE = re.compile(r"^(lab_compute_nodes|lab_network_subnet|lab_ip_offset):\s*([^\s#]+)")


class InventoryError(Exception):
    """Bad lab settings; the message says which one and why."""


def read_settings(path: Path, env: dict[str, str]) -> dict[str, str]:
    """The three top-level scalars hosts.py needs, from lab.yml (flat `key: value` lines) and the env."""
    found: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        match = _LINE.match(line)
        if match:
            found[match.group(1)] = match.group(2).strip("'\"")
    for key in ("lab_compute_nodes", "lab_network_subnet", "lab_ip_offset"):
        if key not in found:
            raise InventoryError(f"{path}: missing top-level `{key}: <value>` line")
    if env.get("LAB_COMPUTE_NODES"):
        found["lab_compute_nodes"] = env["LAB_COMPUTE_NODES"]
    return found


def build(settings: dict[str, str], ssh_dir: Path) -> dict:
    """The inventory in Ansible's --list JSON shape."""
    raw_count = settings["lab_compute_nodes"]
    if not raw_count.isdigit() or not 1 <= int(raw_count) <= MAX_NODES:
        raise InventoryError(
            f"lab_compute_nodes (or LAB_COMPUTE_NODES) must be an integer 1..{MAX_NODES}, got {raw_count!r}"
        )
    count = int(raw_count)
    try:
        net = ipaddress.ip_network(settings["lab_network_subnet"])
    except ValueError as exc:
        raise InventoryError(f"lab_network_subnet: {exc}") from exc
    if net.version != 4 or net.prefixlen != 24 or not net.is_private:
        raise InventoryError(f"lab_network_subnet must be a private IPv4 /24, got {net}")
    offset = settings["lab_ip_offset"]
    if not offset.isdigit() or int(offset) < 2 or int(offset) + count > 254:
        raise InventoryError(f"lab_ip_offset must leave room for {count + 1} nodes in .2-.254, got {offset}")
    base = int(offset)

    names = ["lab-ctl"] + [f"lab-node{i}" for i in range(1, count + 1)]
    ssh_args = (
        f"-o UserKnownHostsFile={ssh_dir / 'known_hosts'} -o StrictHostKeyChecking=yes -o IdentitiesOnly=yes"
    )
    # The lab's address plan: every name the lab can have (lab-ctl, lab-node1..MAX_NODES) and its fixed
    # address, which every container gets in its /etc/hosts (podman --add-host, written again at each start).
    # Names and, above all, reverse lookups of node addresses then never wait on podman's DNS, whose
    # upstream timed out now and then: torch's TCPStore looks up the peer of each connection, and the store
    # of a requeued run came up 10-20 s late ("The hostname of the client socket cannot be retrieved.
    # err=-3"). Fixed for every node count: adding a node changes no running container.
    # torch's sockets are IPv6 ones with IPv4-mapped addresses (::ffff:10.89.42.11), whose reverse lookups
    # /etc/hosts answers only from lines of that form: each address twice (podman's --add-host takes one
    # address per name, hence the ".v4mapped" name of the second).
    plan = {"lab-ctl": str(net.network_address + base)}
    for i in range(1, MAX_NODES + 1):
        if base + i <= 254:
            plan[f"lab-node{i}"] = str(net.network_address + base + i)
    plan.update({f"{name}.v4mapped": f"::ffff:{addr}" for name, addr in list(plan.items())})
    hostvars: dict[str, dict] = {
        "localhost": {
            "ansible_connection": "local",
            "ansible_python_interpreter": "/usr/bin/python3",
            "lab_hosts_table": plan,
        }
    }
    for index, name in enumerate(names):
        ip = str(net.network_address + base + index)
        hostvars[name] = {
            "ansible_host": ip,
            "lab_ip": ip,
            "ansible_user": "root",
            "ansible_python_interpreter": "/usr/bin/python3",
            "ansible_ssh_private_key_file": str(ssh_dir / "id_ed25519"),
            "ansible_ssh_common_args": ssh_args,
        }
        # Slurm reaches every node and the controller by address: podman's DNS forgets a killed container, and
        # answered lookups slowly while a container was being disconnected (docs/scheduler.md#node-addresses)
        hostvars[name]["slurm_node_addr"] = ip
    return {
        "_meta": {"hostvars": hostvars},
        "all": {"children": ["ungrouped", "lab_host", "cluster"]},
        "lab_host": {"hosts": ["localhost"]},
        "cluster": {"children": ["controller", "compute", "monitoring", "login"]},
        "controller": {"hosts": ["lab-ctl"]},
        "monitoring": {"hosts": ["lab-ctl"]},
        "compute": {"hosts": names[1:]},
        "login": {"hosts": []},
    }


def main(argv: list[str]) -> int:
    try:
        inventory = build(read_settings(LAB_VARS, dict(os.environ)), SSH_DIR)
    except (InventoryError, OSError) as exc:
        print(f"inventories/lab/hosts.py: {exc}", file=sys.stderr)
        return 1
    if len(argv) == 3 and argv[1] == "--host":
        print(json.dumps(inventory["_meta"]["hostvars"].get(argv[2], {})))
    elif len(argv) == 2 and argv[1] == "--list":
        print(json.dumps(inventory, indent=2))
    else:
        print("usage: hosts.py --list | --host NAME", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
