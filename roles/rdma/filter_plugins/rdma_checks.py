"""Filters of roles/rdma: HCA ports read from /sys/class/infiniband checked against the spec.

Input lines come from `tasks/verify.yml`: '<hca> <port> <attribute> <value...>' where attribute is one of
rate ("400 Gb/sec (4X NDR)"), state ("4: ACTIVE"), phys_state ("5: LinkUp"), link_layer ("InfiniBand" or
"Ethernet"): the files ibstat itself reads. Unit-tested in tests/unit/test_rdma_role.py.
"""

from __future__ import annotations

import re
from typing import Any

_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec")
MELLANOX_VENDOR = "0x15b3"
NET_CLASSES = ("0x0200", "0x0207")  # Ethernet controller, InfiniBand controller
LINK_LAYER = {"infiniband": "InfiniBand", "roce": "Ethernet"}


def parse_ports(lines: list[str]) -> dict[str, dict[str, dict[str, str]]]:
    """{hca: {port: {attribute: value}}}."""
    ports: dict[str, dict[str, dict[str, str]]] = {}
    for line in lines:
        parts = line.split(None, 3)
        if len(parts) < 3:
            continue
        hca, port, attr = parts[0], parts[1], parts[2]
        ports.setdefault(hca, {}).setdefault(port, {})[attr] = parts[3].strip() if len(parts) == 4 else ""
    return ports


def port_problems(lines: list[str], hcas: list[str], rate_gbps: float, fabric_type: str) -> list[str]:
    """Every HCA of the spec that is missing, down, on the wrong link layer or at the wrong rate."""
    ports = parse_ports(lines)
    problems = []
    want_layer = LINK_LAYER.get(fabric_type)
    for hca in hcas:
        if hca not in ports:
            present = ", ".join(sorted(ports)) or "none"
            problems.append(f"{hca}: not present (RDMA devices on this node: {present})")
            continue
        for port, attrs in sorted(ports[hca].items()):
            where = f"{hca} port {port}"
            state = attrs.get("state", "")
            if "ACTIVE" not in state:
                phys = attrs.get("phys_state", "?")
                problems.append(f"{where}: state {state or '?'} (phys_state {phys}), expected ACTIVE")
            layer = attrs.get("link_layer", "")
            if want_layer and layer and layer != want_layer:
                problems.append(f"{where}: link layer {layer}, fabric.type={fabric_type} needs {want_layer}")
            if float(rate_gbps or 0) > 0:
                match = _RATE.match(attrs.get("rate", ""))
                rate = float(match.group(1)) if match else None
                if rate is None or rate != float(rate_gbps):
                    got = attrs.get("rate", "unknown") or "unknown"
                    problems.append(f"{where}: rate {got}, the spec says fabric.rate_gbps={rate_gbps:g}")
    return problems


def mellanox_pci_count(lines: list[str]) -> int:
    """Mellanox/NVIDIA networking PCI functions (vendor 0x15b3, network or InfiniBand class)."""
    count = 0
    for line in lines:
        parts = line.split()
        if (
            len(parts) == 3
            and parts[1].lower() == "0x15b3"
            and parts[2].lower().startswith(("0x0200", "0x0207"))
        ):
            count += 1
    return count


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "rdma_port_problems": port_problems,
            "rdma_mellanox_pci_count": mellanox_pci_count,
        }
