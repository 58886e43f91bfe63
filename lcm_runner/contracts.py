"""Contracts shared by the trainer, the launchers, the stages and the report (see docs/design.md).

One place names the exit codes and the telemetry events; every side imports them from here.
"""

from __future__ import annotations

from enum import IntEnum

LAUNCHERS = ("slurm", "torchrun")  # how a stage's jobs are started: an sbatch job, or torchrun over ssh
AGENTS = ("lcm", "torchrun")  # the per-node agent: lcm_runner.launch.agent, or stock torchrun


class ExitCode(IntEnum):
    """Trainer exit codes, read by the sbatch script and the torchrun launcher."""

    OK = 0
    FAILURE = 1
    BAD_ARGS = 2  # argparse / a flag this build cannot honour
    REQUEUE = 75  # EX_TEMPFAIL: checkpointed after SIGUSR1/SIGTERM, requeue me
    # 76 is the agent's NODE_LOST (lcm_runner.launch.agent.AgentExit)
    NONFINITE = 77  # NaN/Inf loss or grad norm beyond the skip budget: `latest` rewound, restart from it
    NO_GOOD_CHECKPOINT = 78  # checkpoints exist but none verifies: stop, never start from scratch
    NONFINITE_REPEATED = 79  # non-finite again after every allowed rewind: deterministic, stop
    CKPT_SAVE_FAILED = 80  # a save failed (e.g. ENOSPC): `latest` unchanged, partial removed, stop


# Exit codes after which a restart would fail the same way (the agent stops, the sbatch does not requeue).
FATAL_EXIT_CODES = frozenset(
    {
        int(ExitCode.BAD_ARGS),
        int(ExitCode.NO_GOOD_CHECKPOINT),
        int(ExitCode.NONFINITE_REPEATED),
        int(ExitCode.CKPT_SAVE_FAILED),
    }
)


# Telemetry: JSON Lines, <run_dir>/telemetry/rank<R>.jsonl, one record per line, flushed per line.
# Every record has: ts (unix seconds, float), event, rank, attempt (restart count), job.
EVENT_START = "start"  # world_size, tp, pp, ep, dp, resumed_from
EVENT_STEP = "step"  # step, loss, step_time_s, tokens_per_s, comm_time_s (when measurable)
EVENT_CKPT_BEGIN = "ckpt_begin"  # step, path
EVENT_CKPT_END = "ckpt_end"  # step, blocking_s, total_s, bytes, path
EVENT_RESUME = "resume"  # step, load_s, path
EVENT_SIGNAL = "signal"  # name
EVENT_EXIT = "exit"  # code, reason
EVENT_NONFINITE = "nonfinite"  # step, what (loss|grad_norm), skipped (count so far), ranks
EVENT_CKPT_REJECTED = "ckpt_rejected"  # step, path, file, reason (a checkpoint that failed verification)
EVENT_CKPT_GOOD = "ckpt_good"  # step: the checkpoint verified and training made healthy progress from it
EVENT_CKPT_FAILED = "ckpt_failed"  # step, path, reason (a save that did not complete)
EVENT_REWIND = "rewind"  # from_step, to_step, reason (latest moved back to a known-good checkpoint)

TELEMETRY_DIR = "telemetry"
LATEST_FILE = "latest_checkpointed_iteration.txt"  # Megatron-LM's tracker file


def iter_dir_name(step: int) -> str:
    """Megatron-LM's checkpoint directory name for a step."""
    return f"iter_{step:07d}"


def telemetry_file_name(rank: int) -> str:
    return f"rank{rank}.jsonl"
