"""`lcm-runner metrics train|slurm` (registered by lcm_runner/cli.py); also `python -m lcm_runner.metrics`.

    metrics train --run-dir D --job-id ID --out FILE [--retain-s S] [--host H] [--interval-s 5] [--once]
        one per node of a job (the sbatch script starts it beside the agent): this node's ranks'
        telemetry -> FILE, one file per job (<textfile_dir>/lcm_train_<job id>.prom; docs/monitoring.md,
        "Training metrics"). With --retain-s, at its start and at its end it removes the other jobs'
        lcm_train*.prom files not written for S seconds: a finished job's last sample stays readable for
        S seconds (many scrapes), and a dead writer's file does not stay forever
    metrics slurm --out FILE [--interval-s 15] [--once]
        on the controller: sinfo/squeue -> FILE (the lcm_slurm_* metrics)

Both write FILE atomically every interval. `train` ends on SIGTERM/SIGINT, or by itself once every
rank of this node has exited and no new `start` came for two intervals (longer after an exit code that
the agent restarts in place: the new process needs time to start), with a last file where
`lcm_train_running` is 0. Neither ever fails its caller: a missing or unwritable output directory is
one line on stderr and exit 0.
"""

from __future__ import annotations

import argparse
import socket
import sys
import time
from pathlib import Path
from typing import Any

from . import exposition, slurm, train
from .loop import Publisher, Stopper, output_problem, sweep_stale

# After an exit code the agent restarts in place (not FINAL_EXIT_CODES) the new process writes its
# `start` once torch is imported and the model built: wait this long before ending on our own.
RESTART_GRACE_S = 300.0
TRAIN_FILE_PREFIX = (
    "lcm_train"  # what --retain-s sweeps: lcm_train*.prom (the pre-per-job lcm_train.prom too)
)


def _positive(text: str) -> float:
    v = float(text)
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return v


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="metrics_command", required=True, metavar="what")
    t = sub.add_parser(
        "train",
        help="publish this node's ranks' training metrics (node_exporter textfile collector)",
        description="Follow the telemetry of this node's ranks and write their metrics to --out.",
    )
    t.add_argument("--run-dir", required=True, help="the run directory (its telemetry/rank<R>.jsonl)")
    t.add_argument("--job-id", required=True, help="Slurm job id (the records' `job`)")
    t.add_argument("--out", required=True, type=Path, help="<textfile_dir>/lcm_train_<job id>.prom")
    t.add_argument(
        "--retain-s",
        type=_positive,
        default=None,
        help="remove the directory's other lcm_train*.prom not written for this long (default: keep them)",
    )
    t.add_argument("--host", default=None, help="this node's name as the ranks record it (default: hostname)")
    t.add_argument("--interval-s", type=_positive, default=5.0, help="seconds between writes (default 5)")
    t.add_argument("--once", action="store_true", help="read, write once, exit")
    t.set_defaults(func=run_train)
    s = sub.add_parser(
        "slurm",
        help="publish Slurm node and queue state (sinfo, squeue) for the textfile collector",
        description="Write the lcm_slurm_* metrics to --out every --interval-s.",
    )
    s.add_argument("--out", required=True, type=Path, help="<textfile_dir>/lcm_slurm.prom")
    s.add_argument("--interval-s", type=_positive, default=15.0, help="seconds between writes (default 15)")
    s.add_argument("--once", action="store_true", help="collect, write once, exit")
    s.set_defaults(func=run_slurm)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "metrics",
        help="training / Slurm metrics for node_exporter's textfile collector (docs/monitoring.md)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p)
    return p


def _cannot_write(prog: str, out: Path) -> int | None:
    problem = output_problem(out)
    if problem is None:
        return None
    print(f"{prog}: not publishing metrics: {problem}", file=sys.stderr, flush=True)
    return 0


def run_train(ns: argparse.Namespace) -> int:
    prog = "lcm-runner metrics train"
    out: Path = ns.out
    if (rc := _cannot_write(prog, out)) is not None:
        return rc
    stopper = Stopper().install()
    if ns.retain_s:
        sweep_stale(out, TRAIN_FILE_PREFIX, ns.retain_s)
    host = ns.host or socket.gethostname()
    collector = train.TrainCollector(ns.run_dir, ns.job_id, host)
    pub = Publisher(out, prog)
    interval = float(ns.interval_s)
    exited_since: float | None = None
    starts = -1
    while True:
        collector.poll()
        pub.publish(exposition.render(collector.families(time.time(), alive=True)))
        if ns.once or stopper.stopped:
            break
        done, final = collector.all_exited()
        grace = 2 * interval if final else max(2 * interval, RESTART_GRACE_S)
        if not done or collector.starts_seen != starts:
            exited_since, starts = None, collector.starts_seen
        elif exited_since is None:
            exited_since = time.monotonic()
        elif time.monotonic() - exited_since >= grace:
            break
        stopper.sleep(interval)
        if stopper.stopped:
            break
    if not ns.once:
        collector.poll()
        pub.publish(exposition.render(collector.families(time.time(), alive=False)))
    if ns.retain_s:
        sweep_stale(out, TRAIN_FILE_PREFIX, ns.retain_s)
    return 0


def run_slurm(ns: argparse.Namespace) -> int:
    prog = "lcm-runner metrics slurm"
    out: Path = ns.out
    if (rc := _cannot_write(prog, out)) is not None:
        return rc
    stopper = Stopper().install()
    pub = Publisher(out, prog)
    failing = False
    while True:
        try:
            state: slurm.SlurmState | None = slurm.collect()
        except Exception as e:  # SlurmCollectError, or anything unforeseen: never end the collector
            state = None
            if not failing:
                print(f"{prog}: collection failed: {e}", file=sys.stderr, flush=True)
        failing = state is None
        pub.publish(exposition.render(slurm.build_families(state, time.time())))
        if ns.once:
            break
        stopper.sleep(float(ns.interval_s))
        if stopper.stopped:
            break
    return 0


def build_parser(prog: str = "python -m lcm_runner.metrics") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(p)
    return p


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    return int(ns.func(ns))
