"""Find and kill the processes of one run on one node, by the environment tag the launchers set.

Every agent a launcher starts carries ``LCM_RUN_TAG=<tag>`` and ``LCM_NODE=<node>`` in its environment;
workers, their multiprocessing helpers and anything else they start inherit both, even after they are
re-parented. Scanning ``/proc/<pid>/environ`` therefore finds every leftover of a run on a node, which is
what ``processes_left`` reports after each fault case. Runs as a module on a node too (Slurm, through
``srun --overlap``): ``python -m lcm_runner.launch.procs {list,kill-trainer,kill-all,stop-all} --tag TAG``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

TAG_ENV = "LCM_RUN_TAG"
NODE_ENV = "LCM_NODE"
TRAINER_COMM = "lcm-trainer"  # the agent names its forked workers so (prctl PR_SET_NAME)
TRAINER_MODULE = "lcm_runner.train"
# the modules a rank runs (`python -m`): the trainer, or the bridge to a user's Megatron-LM
# (RunConfig.train_module; the bridge's child, the user's script, dies with it: PR_SET_PDEATHSIG)
RANK_MODULES = (TRAINER_MODULE, "lcm_runner.workloads.megatron_lm.bridge")
# the node's training-metrics writer (`python -m lcm_runner.metrics train`): the batch script's node task
# starts it beside the agent and stops it after the agent (SIGTERM: a last file with lcm_train_running 0)
METRICS_MODULE = "lcm_runner.metrics"


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    comm: str
    cmdline: str
    node: str

    @property
    def is_trainer(self) -> bool:
        """A training rank: forked by our agent (comm lcm-trainer) or torchrun-run (`-m` one of
        RANK_MODULES)."""
        if self.comm == TRAINER_COMM:
            return True
        # `python [-u] -m lcm_runner.train ...`; not torchrun's agent (`-m torch.distributed.run ... -m
        # lcm_runner.train`), whose first -m names another module
        return self.module in RANK_MODULES

    @property
    def module(self) -> str:
        """The module of `python ... -m <module>` (the first -m), or "" for anything else."""
        argv = self.cmdline.split()
        if "-m" not in argv:
            return ""
        return next(iter(argv[argv.index("-m") + 1 :]), "")

    @property
    def is_metrics_writer(self) -> bool:
        """The node's training-metrics writer: the batch script's process beside the agent, not the
        agent's (the agent's teardown leaves it to the node task, which stops it after the agent)."""
        return self.module == METRICS_MODULE


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:  # gone, or not ours to read
        return None


def scan(tag: str, node: str | None = None) -> list[Proc]:
    """Processes on this machine whose environment carries the run tag (and the node, when given)."""
    want_tag = f"{TAG_ENV}={tag}".encode()
    want_node = f"{NODE_ENV}={node}".encode() if node is not None else None
    me = os.getpid()
    found: list[Proc] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        env = _read(entry / "environ")
        if env is None:
            continue
        fields = env.split(b"\0")
        if want_tag not in fields or (want_node is not None and want_node not in fields):
            continue
        stat = _read(entry / "stat")
        if stat is None:
            continue
        # state is after the last ')' (comm may contain spaces or parentheses)
        rest = stat[stat.rindex(b")") + 2 :].split()
        if rest[0] == b"Z":  # a zombie holds nothing; its parent reaps it
            continue
        comm = stat[stat.index(b"(") + 1 : stat.rindex(b")")].decode(errors="replace")
        cmd = (_read(entry / "cmdline") or b"").replace(b"\0", b" ").decode(errors="replace").strip()
        node_name = next((f[len(NODE_ENV) + 1 :].decode() for f in fields if f.startswith(b"LCM_NODE=")), "")
        found.append(Proc(int(entry.name), int(rest[1]), comm, cmd, node_name))
    return found


def union(found: list[Proc]) -> list[Proc]:
    """Each process once (by node and pid), in the order first seen."""
    seen: dict[tuple[str, int], Proc] = {}
    for p in found:
        seen.setdefault((p.node, p.pid), p)
    return list(seen.values())


def kill(procs: list[Proc], sig: int = signal.SIGKILL) -> list[int]:
    killed = []
    for p in procs:
        try:
            os.kill(p.pid, sig)
            killed.append(p.pid)
        except ProcessLookupError:
            pass
    return killed


def freeze_then_kill(victims: list[Proc], groups: tuple[int, ...] = ()) -> list[Proc]:
    """A crash of every process in `victims` at once: all SIGSTOPped first, then the process groups in
    `groups` and every victim SIGKILLed; returns the victims that were frozen, i.e. killed by this call.

    Without the freeze, the first SIGKILLs are seen before the last are sent: a rank whose agent died
    first got the kernel's PR_SET_PDEATHSIG SIGKILL and was reaped before its own kill (ESRCH: not
    counted, a CI run of 2026-12-07 reported "SIGKILL of every rank (0/2)"), and a rank whose peer died
    first may see its socket close and exit by itself. A frozen process runs no handler and notices
    nothing (SIGSTOP cannot be caught) and cannot exit by itself: gone afterwards means killed by us,
    directly or through its parent's death."""
    frozen = set(kill(victims, signal.SIGSTOP))
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    kill([p for p in victims if p.pid in frozen])
    return [p for p in victims if p.pid in frozen]


def agents_own(tag: str, node: str | None) -> list[Proc]:
    """The tagged processes of this node that an agent answers for: all but the metrics writer."""
    return [p for p in scan(tag, node) if not p.is_metrics_writer]


def wait_gone(tag: str, node: str | None, timeout_s: float, *, agents_only: bool = False) -> list[Proc]:
    """Poll until no tagged process remains (or the timeout); returns what is left. agents_only: only
    the processes an agent answers for (`agents_own`)."""
    look = agents_own if agents_only else scan
    deadline = time.monotonic() + timeout_s
    left = look(tag, node)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = look(tag, node)
    return left


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lcm_runner.launch.procs", description=__doc__)
    ap.add_argument("action", choices=["list", "kill-trainer", "kill-all", "stop-all"])
    ap.add_argument("--tag", required=True, help="the run tag (LCM_RUN_TAG) of the job")
    ap.add_argument("--node", default=None, help="only processes started for this node (LCM_NODE)")
    ns = ap.parse_args(argv)
    procs = scan(ns.tag, ns.node)
    if ns.action == "kill-trainer":
        procs = [p for p in procs if p.is_trainer]
    if ns.action == "stop-all":  # frozen, not dead: a crash's first half (see SlurmLauncher.kill_job)
        procs = [p for p in procs if p.pid in kill(procs, signal.SIGSTOP)]
    elif ns.action != "list":
        procs = [p for p in procs if p.pid in kill(procs)]
    out = {"ts": time.time(), "action": ns.action, "procs": [asdict(p) for p in procs]}
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
