"""Storage: what the disks and NFS mounts write while checkpoints are saved, next to the runner's own
checkpoint series (duration, time the step loop was blocked, bytes).

node_disk_written_bytes_total is node_exporter's diskstats (whole devices); the NFS client bytes are the
mountstats collector's (node_mountstats_nfs_*, labels export/mountaddr/protocol), which node_exporter
runs only with --collector.mountstats.
"""

from __future__ import annotations

from .common import JN, LAB, RATE, Dashboard, J, N, Panel, Row, production, q

_NFS = (
    "the lab's shared storage is a bind mount (storage.type lab_shared), not NFS, and node_exporter's "
    "mountstats collector is off by default"
)

WRITES = Row(
    "Writes during checkpoint windows",
    (
        Panel(
            "Disk writes and checkpoint bytes",
            (
                q(
                    f"sum by (node, device) (rate(node_disk_written_bytes_total{N}{RATE}))",
                    "{{node}} {{device}}",
                ),
                q(
                    f"sum by (node) (rate(lcm_train_checkpoint_bytes_total{JN}{RATE}))",
                    "{{node}} checkpoint bytes (ranks)",
                ),
            ),
            LAB,
            unit="Bps",
            description=(
                "Block-device writes per node and device, overlaid with the bytes the node's ranks saved: "
                "a checkpoint shows as a burst in both."
            ),
            width=24,
        ),
        Panel(
            "NFS client writes",
            (
                q(
                    f"sum by (node, export) (rate(node_mountstats_nfs_total_write_bytes_total{N}{RATE}))",
                    "{{node}} {{export}}",
                ),
            ),
            production(_NFS),
            unit="Bps",
            width=24,
        ),
    ),
)

CHECKPOINTS = Row(
    "Checkpoints (runner)",
    (
        Panel(
            "Last save: duration and blocking time",
            (
                q(f"max by (job_id) (lcm_train_checkpoint_duration_seconds{J})", "{{job_id}} total"),
                q(f"max by (job_id) (lcm_train_checkpoint_blocking_seconds{J})", "{{job_id}} blocking"),
            ),
            LAB,
            unit="s",
            description="Slowest rank's last save; blocking is the time its step loop waited.",
            width=8,
        ),
        Panel(
            "Last save: bytes (all ranks)",
            (q(f"sum by (job_id) (lcm_train_checkpoint_bytes{J})", "{{job_id}}"),),
            LAB,
            unit="bytes",
            width=8,
        ),
        Panel(
            "Last checkpointed step",
            (q(f"max by (job_id) (lcm_train_last_checkpoint_step{J})", "{{job_id}}"),),
            LAB,
            width=8,
        ),
    ),
)

DASHBOARD = Dashboard(
    uid="lcm-storage",
    title="lcm-infra / Storage and checkpoints",
    description="Disk and NFS write throughput overlaid with the runner's checkpoint saves.",
    rows=(WRITES, CHECKPOINTS),
    job_variable=True,
)
