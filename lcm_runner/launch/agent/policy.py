"""Exit policy: how a rank's exit ends a generation, and what the agent does when one ends (restart in
place, or exit with which code). The codes are lcm_runner.contracts' ExitCode and AgentExit."""

from __future__ import annotations

from dataclasses import dataclass

from lcm_runner.contracts import FATAL_EXIT_CODES, AgentExit, ExitCode

# how a generation ends (Agent.monitor)
DONE = "done"  # every rank exited 0
RESTART = "restart"  # a rank failed here or on another node: restart in place (budget permitting)
LOST = "lost"  # a node was lost (heartbeat), here or as another agent saw it
REQUEUE = "requeue"  # the ranks checkpointed after a preemption signal (ExitCode.REQUEUE)
SIGNALLED = "signalled"  # the ranks exited after a signal this agent forwarded, without a requeue code
FATAL = "fatal"  # a rank exited with a code every restart would repeat (FATAL_EXIT_CODES)


@dataclass(frozen=True)
class Exit:
    code: int
    reason: str


def code_name(code: int) -> str:
    try:
        return ExitCode(code).name
    except ValueError:
        return f"exit {code}"


def rank_outcome(code: int, forwarded: bool) -> str | None:
    """What a rank's exit `code` does to the generation: FATAL, RESTART, or nothing (None: exit 0, or
    the ranks are stopping after a signal this agent forwarded)."""
    if code in FATAL_EXIT_CODES:
        # bad arguments, no checkpoint that verifies, repeated NaN, a failed save: every restart would
        # end the same way
        return FATAL
    if code != 0 and not forwarded:
        return RESTART
    return None


def failure_detail(node_rank: int, rank: int, code: int, fatal: bool) -> str:
    """The failure as published in the store for the other agents (restart/<gen>)."""
    detail = f"node{node_rank} rank{rank} exited {code}"
    return f"{detail} ({code_name(code)}, fatal)" if fatal else detail


def is_fatal_detail(detail: str) -> bool:
    return detail.endswith(", fatal)")


def fatal_code_of(detail: str) -> int:
    """The exit code in a peer's "nodeN rankR exited C (NAME, fatal)" detail."""
    try:
        return int(detail.split(" exited ", 1)[1].split()[0])
    except (IndexError, ValueError):
        return int(AgentExit.BAD_ARGS)


def all_exited(codes: set[int]) -> tuple[str, str]:
    """Every rank has exited, none with a failure that ended the generation first."""
    if codes == {0}:
        return DONE, ""
    if int(ExitCode.REQUEUE) in codes:
        return REQUEUE, str(sorted(codes))
    return SIGNALLED, str(sorted(codes))


def after(outcome: str, detail: str, *, gen: int, max_restarts: int, fatal_code: int) -> Exit | None:
    """The agent's exit after a generation that ended with `outcome` (not DONE; for LOST, once no
    standby takes the lost node over), or None: restart in place as generation gen + 1."""
    if outcome == REQUEUE:
        return Exit(int(AgentExit.REQUEUE), detail)
    if outcome == SIGNALLED:
        return Exit(int(AgentExit.FAILURE), f"ranks exited {detail} after a signal")
    if outcome == FATAL:
        return Exit(fatal_code or int(AgentExit.BAD_ARGS), detail)
    if outcome == LOST:
        return Exit(int(AgentExit.NODE_LOST), detail)
    if gen >= max_restarts:
        return Exit(int(AgentExit.FAILURE), f"restarts spent: {detail}")
    return None
