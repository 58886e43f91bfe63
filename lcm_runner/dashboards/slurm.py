"""Slurm: the controller's state collector (`lcm-runner metrics slurm`, file lcm_slurm.prom).

Its series carry the controller's `node` label (the textfile is the controller's), so the node variable
selects by `slurm_node` (Slurm names nodes as the inventory does) and nothing else filters by node.
"""

from __future__ import annotations

from .common import LAB, Dashboard, Panel, Row, q

NODES = Row(
    "Nodes",
    (
        Panel(
            "Nodes by state",
            (q("sum by (state) (lcm_slurm_nodes)", "{{state}}"),),
            LAB,
            stack=True,
            width=12,
        ),
        Panel(
            "Node up (not down, drained or not responding)",
            (q('max by (slurm_node) (lcm_slurm_node_up{slurm_node=~"$node"})', "{{slurm_node}}"),),
            LAB,
            width=12,
        ),
        Panel(
            "Nodes not up",
            (q("sum(lcm_slurm_node_up == bool 0)"),),
            LAB,
            kind="stat",
            threshold=1.0,
            width=8,
        ),
        Panel(
            "Collector success",
            (q("min(lcm_slurm_collect_success)"),),
            LAB,
            kind="stat",
            description="1 when the last `lcm-runner metrics slurm` run read Slurm's state.",
            width=8,
        ),
        Panel(
            "Collector age",
            (q("time() - max(lcm_slurm_collect_timestamp_seconds)"),),
            LAB,
            kind="stat",
            unit="s",
            threshold=60.0,
            description="Seconds since the collector last wrote (it runs every 15 s).",
            width=8,
        ),
    ),
)

JOBS = Row(
    "Jobs",
    (
        Panel(
            "Jobs by partition and state",
            (q("sum by (partition, state) (lcm_slurm_jobs)", "{{partition}} {{state}}"),),
            LAB,
            stack=True,
            width=24,
        ),
    ),
)

DASHBOARD = Dashboard(
    uid="lcm-slurm",
    title="lcm-infra / Slurm",
    description="Slurm nodes by state, node up, jobs by partition and state, the collector's health.",
    rows=(NODES, JOBS),
)
