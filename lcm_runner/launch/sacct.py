"""Slurm accounting as the runner reads it: `sacct -P` records of its jobs, and whether accounting is on.

    sacct -j 12,13 --duplicates -P -n -o JobID,JobName,State,ExitCode,NodeList,Start,End

`--duplicates` keeps every run of a requeued job (one allocation record per run, the same JobID; Slurm
22.05's sacct has no restart-count field: a job's restarts are its allocation records less one). Records
of job steps (`12.batch`, `12.0`) are parsed too and kept apart from the allocation records.

    accounting_storage(run)      "accounting_storage/slurmdbd", or "" when scontrol does not say
    parse_sacct(text)            -> [SacctRecord]
    job_accounts(records)        -> {job id: JobAccount}  (runs in start order, the final state, restarts)
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

SACCT_FIELDS = ("JobID", "JobName", "State", "ExitCode", "NodeList", "Start", "End")
# States of a run that is over (sacct shows RUNNING/PENDING/REQUEUED... while Slurm still owns the job).
ENDED_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "REQUEUED",
        "TIMEOUT",
    }
)
NO_ACCOUNTING = ("accounting_storage/none", "")

RunCmd = Callable[[list[str]], str]


class SacctError(ValueError):
    """sacct output that does not have the fields asked for."""


@dataclass(frozen=True)
class SacctRecord:
    """One line of `sacct -P -o SACCT_FIELDS`."""

    job_id: str  # the job, without a step suffix (12 for 12, 12.batch, 12.0)
    step: str  # "" for the allocation record, else the step name (batch, extern, 0, ...)
    name: str
    state: str  # first word of State ("CANCELLED by 0" -> CANCELLED)
    exit_code: int
    exit_signal: int
    nodes: str  # Slurm hostlist, as sacct prints it (lab-node[1-2])
    start: str
    end: str

    @property
    def ended(self) -> bool:
        return self.state in ENDED_STATES

    @property
    def exit(self) -> str:
        """ "<code>:<signal>", or "" where sacct has none (a step on a node that died)."""
        if (self.exit_code, self.exit_signal) == UNKNOWN_EXIT:
            return ""
        return f"{self.exit_code}:{self.exit_signal}"


@dataclass
class JobAccount:
    """A job's allocation records in start order: one per run (requeues add runs)."""

    job_id: str
    runs: list[SacctRecord] = field(default_factory=list)
    steps: list[SacctRecord] = field(default_factory=list)

    @property
    def restarts(self) -> int:
        return max(len(self.runs) - 1, 0)

    @property
    def final(self) -> SacctRecord | None:
        return self.runs[-1] if self.runs else None

    @property
    def ended(self) -> bool:
        return self.final is not None and self.final.ended and self.final.state != "REQUEUED"


def sacct_argv(job_ids: Iterable[str]) -> list[str]:
    return [
        "sacct",
        "-j",
        ",".join(job_ids),
        "--duplicates",
        "-P",
        "-n",
        "-o",
        ",".join(SACCT_FIELDS),
    ]


UNKNOWN_EXIT = (-1, -1)  # an empty ExitCode: a step whose node died (its batch step on a killed node)


def _exit(value: str, line: str) -> tuple[int, int]:
    if not value.strip():
        return UNKNOWN_EXIT
    m = re.fullmatch(r"(\d+):(\d+)", value.strip())
    if not m:
        raise SacctError(f"ExitCode {value!r} is not <code>:<signal> in: {line!r}")
    return int(m.group(1)), int(m.group(2))


def parse_sacct(text: str) -> list[SacctRecord]:
    """Records of `sacct -P -n -o JobID,JobName,State,ExitCode,NodeList,Start,End` (in its order)."""
    out: list[SacctRecord] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) != len(SACCT_FIELDS):
            raise SacctError(
                f"{len(parts)} fields, expected {len(SACCT_FIELDS)} ({','.join(SACCT_FIELDS)}): {line!r}"
            )
        jobid, name, state, code, nodes, start, end = parts
        job, _, step = jobid.partition(".")
        ec, sig = _exit(code, line)
        out.append(SacctRecord(job, step, name, (state.split() or [""])[0], ec, sig, nodes, start, end))
    return out


def job_accounts(records: Iterable[SacctRecord]) -> dict[str, JobAccount]:
    """By job id; runs in sacct's order (oldest first)."""
    jobs: dict[str, JobAccount] = {}
    for r in records:
        acct = jobs.setdefault(r.job_id, JobAccount(r.job_id))
        (acct.steps if r.step else acct.runs).append(r)
    return jobs


def accounting_storage(run: RunCmd) -> str:
    """slurm.conf's AccountingStorageType as slurmctld reports it ("" when it is not in the output)."""
    for line in run(["scontrol", "show", "config"]).splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "AccountingStorageType":
            return value.strip()
    return ""


__all__ = [
    "ENDED_STATES",
    "NO_ACCOUNTING",
    "SACCT_FIELDS",
    "UNKNOWN_EXIT",
    "JobAccount",
    "SacctError",
    "SacctRecord",
    "accounting_storage",
    "job_accounts",
    "parse_sacct",
    "sacct_argv",
]
