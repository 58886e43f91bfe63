"""Contracts shared by the trainer, the launchers, the stages and the report (see docs/architecture.md).

One place names the exit codes, the launch defaults and the telemetry events; every side imports them
from here.
"""

from __future__ import annotations

from enum import IntEnum

LAUNCHERS = ("slurm", "torchrun")  # how a stage's jobs are started: an sbatch job, or torchrun over ssh
AGENTS = ("lcm", "torchrun")  # the per-node agent: lcm_runner.launch.agent, or stock torchrun

# Launch defaults, one value per setting: the run config (lcm_runner.config), the JobSpec
# (lcm_runner.launch.base) and the agent's config and command line (lcm_runner.launch.agent) use these.
DEFAULT_JOIN_TIMEOUT_S = 60  # seconds for every node to (re)join a generation / torchrun rendezvous
DEFAULT_HB_TIMEOUT_S = 3.0  # lcm agent: a peer whose heartbeat is silent this long is a lost node
DEFAULT_HB_INTERVAL_S = 0.25  # lcm agent: heartbeat cadence (hb timeout must exceed twice this)
DEFAULT_MAX_RESTARTS = 1  # in-place restarts of a job's ranks before the agent gives up
DEFAULT_MASTER_PORT = 29500  # the agents' store; generation g's ranks use master_port + 1 + g
DEFAULT_TIME_LIMIT = "00:30:00"  # Slurm time limit of a job


class ExitCode(IntEnum):
    """Trainer exit codes, read by the sbatch script and the torchrun launcher."""

    OK = 0
    FAILURE = 1
    BAD_ARGS = 2  # argparse / a flag this build cannot honour
    REQUEUE = 75  # EX_TEMPFAIL: checkpointed after SIGUSR1/SIGTERM, requeue me
    # 76 is the agent's NODE_LOST (AgentExit below)
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


class AgentExit(IntEnum):
    """Exit codes of the per-node agent (lcm_runner.launch.agent), read by the sbatch script and the
    launchers. A rank's fatal code (FATAL_EXIT_CODES, an ExitCode) is passed through as the agent's."""

    OK = 0
    FAILURE = 1  # a rank failed and the restart budget is spent, or the agent could not start
    BAD_ARGS = int(ExitCode.BAD_ARGS)
    REQUEUE = int(ExitCode.REQUEUE)  # ranks checkpointed after a preemption signal
    NODE_LOST = 76  # a peer node (its agent) vanished or never joined: relaunch from the checkpoint


# Exit codes of a node's agent after which the batch script requeues the job (resumes from the last
# checkpoint), with the reason it prints. NODE_LOST only where the agent is ours (stock torchrun never
# exits 76): `requeue_exit_codes`.
REQUEUE_REASONS: dict[int, str] = {
    int(ExitCode.REQUEUE): "ExitCode.REQUEUE: checkpointed after SIGUSR1/SIGTERM",
    int(AgentExit.NODE_LOST): "NODE_LOST: a peer node vanished",
    int(ExitCode.NONFINITE): "ExitCode.NONFINITE: NaN/Inf, latest rewound to the newest known-good",
}


def requeue_exit_codes(agent: str) -> dict[int, str]:
    """The requeue codes (and their reasons) of a job whose per-node agent is `agent` (AGENTS)."""
    return {
        code: why for code, why in REQUEUE_REASONS.items() if agent == "lcm" or code != AgentExit.NODE_LOST
    }


# Telemetry: JSON Lines, <run_dir>/telemetry/rank<R>.jsonl, one record per line, flushed per line.
# Every record has: ts (unix seconds, float), event, rank, attempt (restart count), job.
# start: host, pid; local_rank; gpu (physical GPU index: the CUDA_VISIBLE_DEVICES entry at LOCAL_RANK;
# None off CUDA); lcm_runner.metrics publishes a rank on the node its newest start's host names.
EVENT_START = "start"  # world_size, tp, pp, ep, dp, resumed_from, host, pid, local_rank, gpu
# step: loss is the DP-averaged loss, local_loss this rank's own micro-batches' (before the all-reduce);
# with measure_comm, comm_time_s = comm_grad_reduce_s (finalize_model_grads) + comm_loss_allreduce_s.
EVENT_STEP = "step"  # step, loss, local_loss, step_time_s, tokens_per_s, comm_time_s (when measurable)
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
EVENT_FAULT = "fault"  # step, kind (an injected fault the process survives: kind "raise")
EVENT_INPROCESS_RESTART = "inprocess_restart"  # iteration, reason (the restart began in the same process)

# a foreign trainer's console lines (lcm_runner/workloads): lines, events, malformed, malformed_lines
EVENT_LOG_PARSE = "log_parse"

TELEMETRY_DIR = "telemetry"
LATEST_FILE = "latest_checkpointed_iteration.txt"  # Megatron-LM's tracker file


def iter_dir_name(step: int) -> str:
    """Megatron-LM's checkpoint directory name for a step."""
    return f"iter_{step:07d}"


def telemetry_file_name(rank: int) -> str:
    return f"rank{rank}.jsonl"
