"""Slurm node and queue state -> the `lcm_slurm_*` metrics (docs/monitoring.md), from `sinfo`/`squeue`.

Explicit formats, one record a line, `|`-separated (Slurm node, partition and state names cannot
contain `|`):
  sinfo  -h -N -o '%N|%R|%T'   node name | partition | long state (lower case, with Slurm's suffix
                               flags: `*` not responding, `~` powered off, `#` powering up, ...);
                               one line per node and partition
  squeue -h -a -r -o '%P|%T'   partition(s) | job state (upper case); -a every partition (hidden ones
                               too), -r one line per job array element
A command that fails, times out, is missing or prints a line of another shape makes the collection
fail: `lcm_slurm_collect_success 0` and no node or job series (a half-read state is not published as
the state), never an exception out of the collector.
"""

from __future__ import annotations

import subprocess
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .exposition import MetricFamily

SINFO_ARGV = ("sinfo", "-h", "-N", "-o", "%N|%R|%T")
SQUEUE_ARGV = ("squeue", "-h", "-a", "-r", "-o", "%P|%T")
COMMAND_TIMEOUT_S = 10.0
STATE_FLAGS = "*~#!%$@^-"  # suffixes of a long node state (sinfo(1), NODE STATE CODES)
NOT_UP = frozenset({"down", "drained", "fail"})  # plus any node not responding (`*`)
# base states always published (0 when no node is in them), so that rules need no absent()
NODE_STATES = ("idle", "allocated", "mixed", "completing", "down", "drained", "draining")
JOB_STATES = ("pending", "running")  # per partition, 0 when none


class SlurmCollectError(RuntimeError):
    """A command failed or printed something this parser does not know."""


@dataclass(frozen=True)
class NodeState:
    name: str
    state: str  # base state, e.g. idle, mixed, drained
    responding: bool

    @property
    def up(self) -> bool:
        return self.responding and self.state not in NOT_UP


def base_state(text: str) -> tuple[str, bool]:
    """(base state, responding) of a long node state: `down*` -> (down, False), `idle~` -> (idle,
    True), `mixed+drain` -> (draining, True), `idle+drain` -> (drained, True)."""
    s = text.strip().lower()
    responding = True
    while s and s[-1] in STATE_FLAGS:
        responding = responding and s[-1] != "*"
        s = s[:-1]
    if not s:
        raise SlurmCollectError(f"empty node state {text!r}")
    base, *flags = s.split("+")
    if base == "drain":
        base = "drained"
    if "drain" in flags:
        if base in ("idle", "drained"):
            base = "drained"
        elif base in ("allocated", "mixed", "completing"):
            base = "draining"
    return base, responding


def _fields(line: str, n: int, what: str) -> list[str]:
    parts = line.split("|")
    if len(parts) != n or not all(p.strip() for p in parts):
        raise SlurmCollectError(f"{what}: unexpected line {line!r} (want {n} '|'-separated fields)")
    return [p.strip() for p in parts]


def parse_sinfo(text: str) -> tuple[dict[str, NodeState], list[str]]:
    """Output of SINFO_ARGV -> (nodes by name, partitions in order of appearance)."""
    nodes: dict[str, NodeState] = {}
    partitions: dict[str, None] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        name, partition, state = _fields(line, 3, "sinfo")
        partitions.setdefault(partition, None)
        base, responding = base_state(state)
        nodes.setdefault(name, NodeState(name, base, responding))  # once per partition: same node
    return nodes, list(partitions)


def parse_squeue(text: str) -> Counter[tuple[str, str]]:
    """Output of SQUEUE_ARGV -> job count per (partition, lower-case state)."""
    jobs: Counter[tuple[str, str]] = Counter()
    for line in text.splitlines():
        if not line.strip():
            continue
        partition, state = _fields(line, 2, "squeue")
        jobs[(partition, state.lower())] += 1
    return jobs


@dataclass
class SlurmState:
    nodes: dict[str, NodeState] = field(default_factory=dict)
    partitions: list[str] = field(default_factory=list)
    jobs: Counter[tuple[str, str]] = field(default_factory=Counter)


Runner = Callable[[Sequence[str]], str]


def run_command(argv: Sequence[str], timeout_s: float = COMMAND_TIMEOUT_S) -> str:
    """stdout of argv; SlurmCollectError when it cannot run, times out or exits non-zero."""
    try:
        r = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, check=False)
    except FileNotFoundError:
        raise SlurmCollectError(f"{argv[0]}: not found on PATH") from None
    except subprocess.TimeoutExpired:
        raise SlurmCollectError(f"{argv[0]}: no answer within {timeout_s:g} s") from None
    except OSError as e:
        raise SlurmCollectError(f"{argv[0]}: {e}") from None
    if r.returncode != 0:
        why = (r.stderr or r.stdout).strip().splitlines()
        raise SlurmCollectError(f"{argv[0]} exited {r.returncode}: {why[0] if why else 'no output'}")
    return r.stdout


def collect(run: Runner = run_command) -> SlurmState:
    nodes, partitions = parse_sinfo(run(SINFO_ARGV))
    return SlurmState(nodes, partitions, parse_squeue(run(SQUEUE_ARGV)))


def build_families(state: SlurmState | None, now: float) -> list[MetricFamily]:
    """The lcm_slurm_* families; `state` None: the collection failed (success 0, nothing else)."""
    ok = MetricFamily(
        "lcm_slurm_collect_success", "gauge", "Whether sinfo and squeue answered and parsed (1) or not (0)"
    )
    ts = MetricFamily("lcm_slurm_collect_timestamp_seconds", "gauge", "Time of the last collection attempt")
    nodes = MetricFamily("lcm_slurm_nodes", "gauge", "Nodes per base state")
    up = MetricFamily("lcm_slurm_node_up", "gauge", "1 unless the node is down, drained or not responding")
    jobs = MetricFamily("lcm_slurm_jobs", "gauge", "Jobs per partition and state")
    ok.add(0 if state is None else 1)
    ts.add(now)
    if state is not None:
        per_state = Counter(n.state for n in state.nodes.values())
        for s in (*NODE_STATES, *sorted(set(per_state) - set(NODE_STATES))):
            nodes.add(per_state.get(s, 0), state=s)
        for name in sorted(state.nodes):
            up.add(1 if state.nodes[name].up else 0, slurm_node=name)
        counts = Counter(state.jobs)
        for p in state.partitions:
            for s in JOB_STATES:
                counts.setdefault((p, s), 0)
        for (p, s), n in sorted(counts.items()):
            jobs.add(n, partition=p, state=s)
    return [ok, ts, nodes, up, jobs]
