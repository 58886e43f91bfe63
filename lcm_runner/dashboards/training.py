"""Training: the runner's per-rank series (`lcm-runner metrics train`) and the lcm-recording rules.

Step time (mean/p99 rules, the spread across ranks), per-rank local loss and its spread, communication
time by collective and the comm fraction, tokens/s, progress, restarts, checkpoint age, and the GPUs under
the ranks (DCGM series joined to lcm_train_rank_info on node + gpu).
"""

from __future__ import annotations

from .common import ALERTS, JN, LAB, RATE, Dashboard, J, N, Panel, Row, Target, production, q

_RANK = "{{job_id}} rank {{rank}}"
_NO_GPU = (
    "the lab's ranks run on CPU: lcm_train_rank_info has no gpu label there, so nothing joins "
    "(the DCGM side is checked on the GPU health dashboard)"
)
# The rank each GPU serves now: rank_info of live ranks (lcm:train_rank_live), one per (node, gpu).
_RANKS_ON_GPUS = (
    f"max by (node, gpu, job_id, rank) (lcm_train_rank_info{JN}"
    " and on (node, job_id, rank, attempt) lcm:train_rank_live)"
)


def _per_rank_gpu(field: str) -> Target:
    return q(
        f"max by (node, gpu) (DCGM_FI_DEV_{field}{N})"
        f" * on (node, gpu) group_left (job_id, rank) {_RANKS_ON_GPUS}",
        "{{job_id}} rank {{rank}} ({{node}} gpu{{gpu}})",
    )


PROGRESS = Row(
    "Progress",
    (
        Panel(
            "Last step",
            (q(f"max by (job_id) (lcm_train_last_step{J})", "{{job_id}}"),),
            LAB,
            kind="stat",
            width=4,
        ),
        Panel(
            "Live ranks",
            (q(f"count by (job_id) (lcm:train_rank_live{J})", "{{job_id}}"),),
            LAB,
            kind="stat",
            description="Ranks running on nodes whose metrics writer is alive (lcm:train_rank_live).",
            width=4,
        ),
        Panel(
            "Restarts (max over ranks)",
            (q(f"max by (job_id) (lcm_train_restarts{J})", "{{job_id}}"),),
            LAB,
            kind="stat",
            width=4,
        ),
        Panel(
            "Since last step",
            (q(f"time() - max by (job_id) (lcm_train_last_step_timestamp_seconds{J})", "{{job_id}}"),),
            LAB,
            kind="stat",
            unit="s",
            threshold=60.0 * ALERTS["no_step_minutes"],
            width=4,
        ),
        Panel(
            "Since last checkpoint",
            (q(f"time() - max by (job_id) (lcm_train_last_checkpoint_timestamp_seconds{J})", "{{job_id}}"),),
            LAB,
            kind="stat",
            unit="s",
            threshold=60.0 * ALERTS["checkpoint_age_minutes"],
            width=4,
        ),
        Panel(
            "Tokens / s",
            (q(f"avg by (job_id) (lcm_train_tokens_per_second{J})", "{{job_id}}"),),
            LAB,
            kind="stat",
            description="Global batch tokens over the last step's time, as each rank measured it (mean).",
            width=4,
        ),
    ),
)

STEP_TIME = Row(
    "Step time",
    (
        Panel(
            "Step time: mean and p99 over 5 m, baseline",
            (
                q(f"lcm:train_step_seconds:mean5m{J}", "{{job_id}} mean"),
                q(f"lcm:train_step_seconds:p99_5m{J}", "{{job_id}} p99"),
                q(f"max by (job_id) (lcm_train_step_seconds_baseline{J})", "{{job_id}} baseline"),
                q(
                    f"{ALERTS['step_p99_regression_ratio']}"
                    f" * max by (job_id) (lcm_train_step_seconds_baseline{J})",
                    "{{job_id}} p99 alert line",
                ),
            ),
            LAB,
            unit="s",
            description=(
                "Recording rules lcm:train_step_seconds:*; the baseline is the median of steps 6..25 of "
                "attempt 0; the alert fires when p99 stays above ratio x baseline "
                "(monitoring.alerts.step_p99_regression_ratio, default)."
            ),
            width=24,
        ),
        Panel(
            "Step time per rank (last step)",
            (q(f"max by (job_id, rank) (lcm_train_step_seconds{JN})", _RANK),),
            LAB,
            unit="s",
        ),
        Panel(
            "Step-time spread across ranks",
            (
                q(f"stddev by (job_id) (lcm_train_step_seconds{JN})", "{{job_id}} stddev"),
                q(
                    f"max by (job_id) (lcm_train_step_seconds{JN})"
                    f" - min by (job_id) (lcm_train_step_seconds{JN})",
                    "{{job_id}} max - min",
                ),
            ),
            LAB,
            unit="s",
            description="A straggler shows as a growing spread while the mean hardly moves.",
        ),
    ),
)

LOSS = Row(
    "Loss",
    (
        Panel(
            "Local loss per rank (ranks must stay tight)",
            (
                q(f"max by (job_id, rank) (lcm_train_local_loss{JN})", _RANK),
                q(f"avg by (job_id) (lcm_train_loss{J})", "{{job_id}} global (DP average)"),
            ),
            LAB,
            description="Each rank's loss on its own micro-batches (before the all-reduce); the global loss.",
        ),
        Panel(
            "Local loss spread (max - min over running ranks)",
            (q(f"lcm:train_local_loss:spread{J}", "{{job_id}}"),),
            LAB,
            threshold=float(ALERTS["loss_spread_max"]),
            description="Red line: monitoring.alerts.loss_spread_max (default).",
        ),
    ),
)

COMMUNICATION = Row(
    "Communication",
    (
        Panel(
            "Communication time by collective (share of wall time, mean over ranks)",
            (
                q(
                    f"avg by (job_id, collective) (rate(lcm_train_comm_seconds_total{JN}{RATE}))",
                    "{{job_id}} {{collective}}",
                ),
            ),
            LAB,
            unit="percentunit",
            stack=True,
            description="Timed collectives (grad_reduce, loss_allreduce): seconds in them per second.",
        ),
        Panel(
            "Communication fraction of step time",
            (
                q(f"lcm:train_comm_fraction:5m{J}", "{{job_id}} 5 m"),
                q(f"max by (job_id, rank) (lcm_train_comm_fraction{JN})", f"{_RANK} last step"),
            ),
            LAB,
            unit="percentunit",
            threshold=float(ALERTS["comm_fraction_max"]),
            description="Red line: the SLO (monitoring.alerts.comm_fraction_max, default).",
        ),
    ),
)

GPUS = Row(
    "GPUs under the ranks",
    (
        Panel("GPU utilization per rank", (_per_rank_gpu("GPU_UTIL"),), production(_NO_GPU), unit="percent"),
        Panel("GPU memory used per rank", (_per_rank_gpu("FB_USED"),), production(_NO_GPU), unit="mbytes"),
        Panel(
            "GPU temperature per rank",
            (_per_rank_gpu("GPU_TEMP"),),
            production(_NO_GPU),
            unit="celsius",
            threshold=float(ALERTS["gpu_temp_c"]),
        ),
        Panel("GPU power per rank", (_per_rank_gpu("POWER_USAGE"),), production(_NO_GPU), unit="watt"),
    ),
)

DASHBOARD = Dashboard(
    uid="lcm-training",
    title="lcm-infra / Training",
    description="Per-job and per-rank training health: step time, loss, communication, progress, GPUs.",
    rows=(PROGRESS, STEP_TIME, LOSS, COMMUNICATION, GPUS),
    job_variable=True,
)
