"""Fabric: per-NIC throughput, TCP retransmissions and link errors (node_exporter netdev, netstat,
netclass: every node, the lab too), and the InfiniBand ports (node_exporter's infiniband collector,
metric names as node_exporter 1.5 publishes them: node_infiniband_<counter> with labels device, port).
"""

from __future__ import annotations

from .common import ALERTS, LAB, RATE, Dashboard, Panel, Row, Target, production, q

NIC = '{node=~"$node", device!="lo"}'
_NIC_LEG = "{{node}} {{device}}"
_IB_LEG = "{{node}} {{device}} port {{port}}"
_IB = "the lab's nodes have no InfiniBand HCA (fabric.type ethernet): node_exporter exports no port"


def _nic_rate(metric: str, legend: str = _NIC_LEG) -> Target:
    return q(f"sum by (node, device) (rate({metric}{NIC}{RATE}))", legend)


def _ib_rate(counter: str, legend: str) -> Target:
    return q(
        f'sum by (node, device, port) (rate(node_infiniband_{counter}{{node=~"$node"}}{RATE}))',
        legend,
    )


ETHERNET = Row(
    "IP network (every NIC but lo)",
    (
        Panel(
            "Receive throughput per NIC",
            (_nic_rate("node_network_receive_bytes_total"),),
            LAB,
            unit="Bps",
        ),
        Panel(
            "Transmit throughput per NIC",
            (_nic_rate("node_network_transmit_bytes_total"),),
            LAB,
            unit="Bps",
        ),
        Panel(
            "TCP retransmitted segments / s",
            (q(f'sum by (node) (rate(node_netstat_Tcp_RetransSegs{{node=~"$node"}}{RATE}))', "{{node}}"),),
            LAB,
            width=8,
        ),
        Panel(
            "TCP retransmitted share of sent segments",
            (
                q(
                    f'sum by (node) (rate(node_netstat_Tcp_RetransSegs{{node=~"$node"}}{RATE}))'
                    f' / sum by (node) (rate(node_netstat_Tcp_OutSegs{{node=~"$node"}}{RATE}))',
                    "{{node}}",
                ),
            ),
            LAB,
            unit="percentunit",
            width=8,
        ),
        Panel(
            "NIC errors / s",
            (
                _nic_rate("node_network_receive_errs_total", "{{node}} {{device}} rx"),
                _nic_rate("node_network_transmit_errs_total", "{{node}} {{device}} tx"),
            ),
            LAB,
            width=8,
        ),
        Panel(
            "Carrier changes in 10 minutes (link flaps)",
            (
                q(
                    f"sum by (node, device) (increase(node_network_carrier_changes_total{NIC}[10m]))",
                    _NIC_LEG,
                ),
            ),
            LAB,
            threshold=float(ALERTS["nic_flaps_max"]),
            description="The alert's window and limit (monitoring.alerts.nic_flaps_max, default).",
            width=24,
        ),
    ),
)

INFINIBAND = Row(
    "InfiniBand ports",
    (
        Panel(
            "InfiniBand receive throughput",
            (_ib_rate("port_data_received_bytes_total", _IB_LEG),),
            production(_IB),
            unit="Bps",
        ),
        Panel(
            "InfiniBand transmit throughput",
            (_ib_rate("port_data_transmitted_bytes_total", _IB_LEG),),
            production(_IB),
            unit="Bps",
        ),
        Panel(
            "InfiniBand port state",
            (
                q(
                    'max by (node, device, port) (node_infiniband_state_id{node=~"$node"})',
                    f"{_IB_LEG} state",
                ),
                q(
                    'max by (node, device, port) (node_infiniband_physical_state_id{node=~"$node"})',
                    f"{_IB_LEG} physical",
                ),
            ),
            production(_IB),
            description="state 4 = active; physical state 5 = link up.",
        ),
        Panel(
            "InfiniBand link errors / s",
            (
                _ib_rate("symbol_error_total", f"{_IB_LEG} symbol"),
                _ib_rate("link_error_recovery_total", f"{_IB_LEG} link recovery"),
                _ib_rate("link_downed_total", f"{_IB_LEG} link downed"),
                _ib_rate("port_errors_received_total", f"{_IB_LEG} rx errors"),
                _ib_rate("port_discards_transmitted_total", f"{_IB_LEG} tx discards"),
            ),
            production(_IB),
        ),
    ),
)

DASHBOARD = Dashboard(
    uid="lcm-fabric",
    title="lcm-infra / Fabric",
    description="Per-NIC throughput, TCP retransmissions, link errors and flaps; InfiniBand ports.",
    rows=(ETHERNET, INFINIBAND),
)
