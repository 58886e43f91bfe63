"""`lcm-runner render`: train_2node.sbatch and nccl_env.sh of a run, from the cluster spec + run config.

Nothing cluster-specific is written by hand: the node count, GPUs (`--gres`), partition, container,
NCCL variables and the agent command all come from the spec, the run config and the launcher's one
command builder (lcm_runner.launch.commands.agent_argv). Inputs are checked against each other
before any file is written.

One-way: the run config becomes a JobSpec (lcm_runner.launch.jobspec.job_spec) and the batch script is
rendered from that JobSpec alone (`sbatch_for`), the same function the Slurm launcher calls for the
JobSpecs the stages build.

Over ~300 lines: the sbatch and nccl_env.sh renderers share the cluster-fit checks and the template context;
the JobSpec comes from launch/jobspec.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import shlex
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jinja2

from lcm_runner.config import ConfigError, RunConfig, cluster_problems, load_cluster, load_run_config
from lcm_runner.contracts import ExitCode, requeue_exit_codes
from lcm_runner.launch.base import JobSpec
from lcm_runner.launch.commands import agent_argv
from lcm_runner.launch.jobspec import job_spec

SBATCH_NAME = "train_2node.sbatch"
# One file per job in cluster.monitoring.textfile_dir (docs/monitoring.md): a job's last sample stays
# there after it ends, for at least TRAIN_METRICS_RETAIN_SCRAPES scrape intervals (and never under
# TRAIN_METRICS_RETAIN_MIN_S), until a later writer on that node sweeps it: the next job on the node never
# overwrites it before Prometheus has read it, and two jobs sharing a node never overwrite each other.
TRAIN_METRICS_PREFIX = "lcm_train_"
TRAIN_METRICS_RETAIN_SCRAPES = 10
TRAIN_METRICS_RETAIN_MIN_S = 600
NCCL_ENV_NAME = "nccl_env.sh"
TEMPLATES = Path(__file__).parent / "templates"
SIGNAL_BEFORE_LIMIT_S = 180
# Subsystems that print the network plugin, per-channel transports, topology/graph search and tuning.
NCCL_PROFILE_SUBSYS = "INIT,ENV,NET,GRAPH,TUNING,P2P,SHM"
_TIME = re.compile(r"^(?:(\d+)-)?(\d{1,2}):(\d{2}):(\d{2})$")


class RenderError(ValueError):
    """The run config asks for something the cluster spec does not provide."""


@dataclass(frozen=True)
class Rendered:
    run_dir: Path
    sbatch: Path
    nccl_env: Path


def _env(trim_blocks: bool = True) -> jinja2.Environment:
    # trim_blocks + keep_trailing_newline, lstrip_blocks off: the Ansible template module's defaults,
    # so the nccl role renders nccl_env.sh.j2 byte for byte like this module.
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        trim_blocks=trim_blocks,
        lstrip_blocks=False,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
        autoescape=False,
    )
    env.filters["sh"] = lambda v: shlex.quote(str(v))
    return env


# ----------------------------------------------------------------------------- nccl_env.sh


def nccl_env_text(
    cluster: dict[str, Any], nccl_debug: str = "WARN", nccl_extra_env: dict[str, str] | None = None
) -> str:
    """nccl_env.sh for a cluster; the same context the Ansible nccl role passes."""
    return (
        _env()
        .get_template("nccl_env.sh.j2")
        .render(cluster=cluster, nccl_debug=nccl_debug, nccl_extra_env=dict(nccl_extra_env or {}))
    )


# ----------------------------------------------------------------------------- sbatch


def slurm_seconds(limit: str) -> int:
    """Slurm time (HH:MM:SS, D-HH:MM:SS or minutes) -> seconds."""
    if limit.isdigit():
        return int(limit) * 60
    m = _TIME.match(limit)
    if not m:
        raise RenderError(f"{limit!r} is not a Slurm time")
    days, h, mi, s = (int(x or 0) for x in m.groups())
    return ((days * 24 + h) * 60 + mi) * 60 + s


def _partition(cluster: dict[str, Any], partition: str | None) -> dict[str, Any]:
    """The spec's partition named `partition`, or its default one when None."""
    parts = cluster.get("slurm", {}).get("partitions", [])
    if partition is not None:
        for p in parts:
            if p["name"] == partition:
                return p
        names = ", ".join(p["name"] for p in parts) or "none"
        raise RenderError(f"partition {partition!r} is not in the spec's slurm.partitions ({names})")
    defaults = [p for p in parts if p.get("default")] or parts[:1]
    if not defaults:
        raise RenderError("the spec has no slurm.partitions and the run config names none")
    return defaults[0]


def check(cluster: dict[str, Any], cfg: RunConfig) -> list[str]:
    """Problems of running `cfg` on `cluster`, each one line."""
    problems: list[str] = []
    gpu = cluster["gpu"]
    have = int(gpu.get("count_per_node", 0))
    if cfg.gpus_per_node > have:
        problems.append(
            f"gpus_per_node={cfg.gpus_per_node} but the spec's nodes have gpu.count_per_node={have}"
        )
    if cfg.gpus_per_node and not gpu.get("gres_type") and have == 0:
        problems.append("a GPU run needs the spec's gpu.gres_type")
    layers = cluster.get("layers", {})
    if cfg.launcher == "slurm" and not layers.get("slurm", False):
        problems.append("launcher is slurm but the spec's layers.slurm is false")
    if cfg.container_image and not layers.get("pyxis", False):
        problems.append(
            "container_image is set but the spec's layers.pyxis is false (no srun --container-image)"
        )
    try:
        part = _partition(cluster, cfg.partition)
    except RenderError as exc:
        problems.append(str(exc))
    else:
        max_time = part.get("max_time")
        unlimited = not max_time or max_time in ("UNLIMITED", "INFINITE")
        if not unlimited and slurm_seconds(cfg.time_limit) > slurm_seconds(str(max_time)):
            problems.append(
                f"time_limit {cfg.time_limit} exceeds partition {part['name']}'s max_time {max_time}"
            )
    if slurm_seconds(cfg.time_limit) <= SIGNAL_BEFORE_LIMIT_S:
        problems.append(
            f"time_limit {cfg.time_limit} leaves no time before the SIGUSR1 checkpoint warning "
            f"({SIGNAL_BEFORE_LIMIT_S} s before the limit)"
        )
    problems += cluster_problems(cfg, cluster)
    return problems


def _shell_arg(arg: str) -> str:
    """Quote an argument; ones that reference the node's shell variables ($SLURM_*) stay expandable."""
    if "$" in arg:
        if re.search(r'["`\\]', arg):
            raise RenderError(f"cannot quote {arg!r} for the node shell")
        return f'"{arg}"'
    return shlex.quote(arg)


def _command_lines(argv: list[str]) -> str:
    """argv as a shell command, one option (with its value) per continued line."""
    lines: list[list[str]] = [[]]
    for i, arg in enumerate(argv):
        starts_option = arg.startswith("-") and not arg.lstrip("-").replace(".", "").isdigit()
        if i > 0 and (starts_option or arg == "--") and lines[-1]:
            lines.append([])
        lines[-1].append(_shell_arg(arg))
    return " \\\n    ".join(" ".join(line) for line in lines)


def agent_command(spec: JobSpec) -> list[str]:
    """The per-node agent argv, from the launcher's one builder, with Slurm's per-node values."""
    argv = agent_argv(
        dataclasses.replace(spec, python="$LCM_PYTHON"),
        node_rank="$SLURM_NODEID",
        master_addr="$MASTER_ADDR",
        events="$LCM_RUN_DIR/agents/$SLURM_JOB_ID/node$SLURM_NODEID.jsonl",
        log_dir="$LCM_RUN_DIR/logs/$SLURM_JOB_ID",
        rdzv_id="$SLURM_JOB_ID",
    )
    if spec.agent == "torchrun":
        # Let torchrun's agent take SIGUSR1 as a stop signal: it forwards it to the workers, waits
        # for their checkpoint (shutdown timeout) and does not restart them (torch >= 2.8 flags).
        at = argv.index("-m", 3)
        grace = str(max(30, SIGNAL_BEFORE_LIMIT_S - 20))
        argv[at:at] = [
            "--signals-to-handle",
            "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1",
            "--shutdown-timeout",
            grace,
        ]
    return argv


def sbatch_text(
    cluster: dict[str, Any],
    cfg: RunConfig,
    run_dir: Path,
    *,
    train_args: list[str] | None = None,
    nccl_profile: bool = False,
    job_name: str | None = None,
    step_sleep_ms: int = 0,
) -> str:
    """The batch script of one launch of `cfg`; `train_args` default to the run config's full training;
    step_sleep_ms > 0 paces every step (--fault-sleep-ms) so that injected faults land mid-run."""
    problems = check(cluster, cfg)
    if problems:
        raise RenderError("the run config does not fit the cluster spec:\n  - " + "\n  - ".join(problems))
    if step_sleep_ms < 0:
        raise RenderError(f"--step-sleep-ms must be >= 0, not {step_sleep_ms}")
    if step_sleep_ms and cfg.workload.foreign:
        raise RenderError(f"--step-sleep-ms: a {cfg.workload.kind} workload's own trainer has no step sleep")
    run_dir = run_dir.resolve()
    ckpt = Path(cfg.checkpoint_dir) if cfg.checkpoint_dir else run_dir / "checkpoints"
    if train_args is None:
        train_args = cfg.to_train_args(str(ckpt), telemetry_dir=str(run_dir / "telemetry"))
    if step_sleep_ms:
        train_args = [*train_args, "--fault-sleep-ms", str(step_sleep_ms)]
    spec = job_spec(cfg, name=cfg.name, run_dir=run_dir, train_args=train_args, python=cfg.python)
    return sbatch_for(cluster, spec, nccl_profile=nccl_profile, job_name=job_name)


@dataclass(frozen=True)
class TrainMetrics:
    """Where each node's `lcm-runner metrics train` writes: <textfile_dir>/lcm_train_<job id>.prom, and
    how long a finished job's file is kept (seconds) before a later writer removes it."""

    textfile_dir: str
    retain_s: int

    def out(self, job_id: str) -> str:
        return f"{self.textfile_dir}/{TRAIN_METRICS_PREFIX}{job_id}.prom"


def train_metrics(cluster: dict[str, Any]) -> TrainMetrics | None:
    """The training-metrics writer's place and retention, or None when the spec's monitoring layer is
    off (the batch script then starts no writer)."""
    if not cluster.get("layers", {}).get("monitoring", False):
        return None
    from lcm_runner.spec import fill_defaults

    mon = fill_defaults(cluster)["monitoring"]
    retain = max(TRAIN_METRICS_RETAIN_MIN_S, TRAIN_METRICS_RETAIN_SCRAPES * int(mon["scrape_interval_s"]))
    return TrainMetrics(str(mon["textfile_dir"]).rstrip("/") or "/", retain)


def sbatch_for(
    cluster: dict[str, Any], spec: JobSpec, *, nccl_profile: bool = False, job_name: str | None = None
) -> str:
    """The batch script of one JobSpec on `cluster` (the spec's python is the nodes' interpreter);
    the run config it came from was checked against the cluster by the caller (`check`)."""
    run_dir = spec.run_dir.resolve()
    gpu = cluster["gpu"]
    gres = ""
    if spec.gpus_per_node:
        gres = (
            f"gpu:{gpu['gres_type']}:{spec.gpus_per_node}"
            if gpu.get("gres_type")
            else f"gpu:{spec.gpus_per_node}"
        )
    metrics = train_metrics(cluster)
    container = None
    if spec.container_image:
        mountpoint = cluster.get("storage", {}).get("mountpoint")
        mounts = [f"{mountpoint}:{mountpoint}"] if mountpoint else []
        if not mountpoint or not str(run_dir).startswith(str(mountpoint).rstrip("/") + "/"):
            mounts.append(f"{run_dir}:{run_dir}")
        if metrics:  # the writer runs in the container too
            mounts.append(f"{metrics.textfile_dir}:{metrics.textfile_dir}")
        mounts += [m for m in spec.container_mounts if m not in mounts]
        container = {"image": spec.container_image, "mounts": ",".join(mounts), "workdir": str(run_dir)}
    requeue_names = requeue_exit_codes(spec.agent)
    argv = agent_command(spec)
    return (
        _env()
        .get_template("train.sbatch.j2")
        .render(
            cluster=cluster,
            run=spec,
            run_dir=str(run_dir),
            run_dir_name=run_dir.name,
            job_name=job_name or f"lcm-{spec.name}",
            partition=_partition(cluster, spec.partition)["name"],
            gres=gres,
            container=container,
            agent=spec.agent,
            agent_cmd=_command_lines(argv),
            python=spec.python,
            nccl_profile=nccl_profile,
            nccl_debug_subsys=NCCL_PROFILE_SUBSYS,
            signal_s=SIGNAL_BEFORE_LIMIT_S,
            requeue_code=int(ExitCode.REQUEUE),
            requeue_codes=sorted(requeue_names),
            requeue_names=requeue_names,
            metrics=metrics,
        )
    )


# ----------------------------------------------------------------------------- run directory


def new_run_dir(root: str | Path, name: str, now: datetime | None = None) -> Path:
    """runs/<UTC yyyymmdd-HHMMSS>-<name>/"""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%d-%H%M%S")
    return Path(root) / f"{stamp}-{name}"


def render_run(
    cluster: dict[str, Any],
    cfg: RunConfig,
    run_dir: Path,
    *,
    nccl_profile: bool = False,
    train_args: list[str] | None = None,
    step_sleep_ms: int = 0,
) -> Rendered:
    """Write nccl_env.sh and the sbatch into run_dir (created with logs/, telemetry/, nccl/)."""
    sbatch = sbatch_text(
        cluster, cfg, run_dir, train_args=train_args, nccl_profile=nccl_profile, step_sleep_ms=step_sleep_ms
    )
    debug = "INFO" if nccl_profile else cfg.nccl.debug
    env_text = nccl_env_text(cluster, debug, cfg.nccl.extra_env)
    run_dir = run_dir.resolve()
    for sub in ("logs", "telemetry", "stages") + (("nccl",) if nccl_profile else ()):
        (run_dir / sub).mkdir(parents=True, exist_ok=True)
    sb = run_dir / SBATCH_NAME
    ne = run_dir / NCCL_ENV_NAME
    sb.write_text(sbatch, encoding="utf-8")
    sb.chmod(0o755)
    ne.write_text(env_text, encoding="utf-8")
    ne.chmod(0o644)
    return Rendered(run_dir, sb, ne)


# ----------------------------------------------------------------------------- CLI


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "render",
        help="write train_2node.sbatch and nccl_env.sh of a run from the cluster spec and run config",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--inventory", "-i", required=True, help="inventories/<name> or its cluster.yml")
    p.add_argument("--config", "-c", required=True, help="run config (configs/lab.yml, configs/h200.yml)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--run-dir", help="render into this directory")
    where.add_argument(
        "--runs-root", default="runs", help="create runs-root/<UTC stamp>-<name>/ (default runs)"
    )
    p.add_argument("--nccl-profile", action="store_true", help="NCCL_DEBUG=INFO, logs into <run_dir>/nccl/")
    p.add_argument(
        "--step-sleep-ms",
        type=int,
        default=0,
        help="slow each step down (the project's trainer on a tiny CPU model) so faults land mid-run",
    )
    p.set_defaults(func=run_cli)
    return p


def run_cli(ns: argparse.Namespace) -> int:
    from lcm_runner.spec import SpecInvalid

    try:
        cfg = load_run_config(ns.config)
        cluster = load_cluster(ns.inventory)
        run_dir = Path(ns.run_dir) if ns.run_dir else new_run_dir(ns.runs_root, cfg.name)
        out = render_run(cluster, cfg, run_dir, nccl_profile=ns.nccl_profile, step_sleep_ms=ns.step_sleep_ms)
    except (ConfigError, SpecInvalid, RenderError) as exc:
        print(f"render: {exc}", file=sys.stderr)
        return 2
    print(f"run dir: {out.run_dir}")
    print(f"  {out.sbatch}")
    print(f"  {out.nccl_env}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lcm-runner")
    sub = parser.add_subparsers(dest="command", required=True)
    add_parser(sub)
    ns = parser.parse_args(["render", *(argv if argv is not None else sys.argv[1:])])
    return int(ns.func(ns))


if __name__ == "__main__":
    sys.exit(main())
