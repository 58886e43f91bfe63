"""`lcm-runner`: one command, subcommands registered from the modules that implement them.

    lcm-runner render    -i inventories/lab -c configs/lab.yml   sbatch + nccl_env.sh (lcm_runner.render)
    lcm-runner baseline      -c configs/lab.yml [-i ...] [--launcher torchrun|slurm]
    lcm-runner resume | fault | nccl-profile   (same options)
    lcm-runner nccl-profile  --parse-only DIR [-i ...]   parse NCCL logs already written (no job)
    lcm-runner all           the whole sequence + the report
    lcm-runner report        (lcm_runner.report)        lcm-runner train   (lcm_runner.train)
    lcm-runner spec validate inventories/<name>         lcm-runner lock update <dir>
    lcm-runner ckpt verify <save dir>
    lcm-runner metrics train|slurm --out FILE   textfile-collector metrics (lcm_runner.metrics)
    lcm-runner health check --expect FILE [--json OUT] [--markdown OUT] [--drain]   (lcm_runner.health)
    lcm-runner probe --expect FILE [--only gemm,copy,allreduce] [--peers DIR]   burn-in (lcm_runner.probes)
    lcm-runner accounting --run-dir DIR   the run's Slurm jobs vs sacct (lcm_runner.stages.accounting)

Every stage prints its run directory at its start and end, its progress (stage, job, step, what it is
waiting for) while it runs, and a one-line verdict; the exit status is 0 unless a stage FAILed
(2: bad input, nothing started).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lcm_runner.config import ConfigError, RunConfig, load_cluster, load_run_config, with_container
from lcm_runner.contracts import AGENTS
from lcm_runner.launch.base import LaunchError

STAGE_COMMANDS = ("baseline", "resume", "fault", "nccl-profile", "all")
# Subcommand -> the module that implements it (it exposes add_parser(subparsers) registering that name).
# A module that cannot be imported still gets its subcommand: one that says why, in one line (exit 2).
EXTERNAL = {
    "render": "lcm_runner.render",
    "report": "lcm_runner.report",
    "train": "lcm_runner.train.cli",
    "ckpt": "lcm_runner.ckpt.cli",
    "spec": "lcm_runner.spec.cli",
    "lock": "lcm_runner.lock",
    "metrics": "lcm_runner.metrics.cli",
    "health": "lcm_runner.health.cli",
    "probe": "lcm_runner.probes.cli",
    "accounting": "lcm_runner.stages.accounting",
}


class UsageError(ValueError):
    """Bad command-line input (exit 2, before anything is launched)."""


def _common(p: argparse.ArgumentParser, config_required: bool = True) -> None:
    p.add_argument(
        "--config",
        "-c",
        required=config_required,
        help="run config (configs/lab.yml, configs/h200.yml)"
        + ("" if config_required else "; required unless --parse-only"),
    )
    p.add_argument(
        "--inventory", "-i", help="inventories/<name> (its cluster spec); required with the slurm launcher"
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument("--run-dir", help="use this run directory (created if missing)")
    where.add_argument("--runs-root", default="runs", help="new run dir runs-root/<UTC stamp>-<name>/")
    p.add_argument("--launcher", choices=("torchrun", "slurm"), help="default: the run config's launcher")
    p.add_argument(
        "--agent", choices=AGENTS, help="per-node agent of the stage's jobs (default: run config's)"
    )
    p.add_argument(
        "--step-sleep-ms",
        type=int,
        default=0,
        help="slow each step down (tiny CPU models) so operator actions land mid-run",
    )
    p.add_argument(
        "--hold-at-step",
        type=int,
        default=0,
        help="with --hold-file: every rank of the stage's jobs waits before this step while the file exists",
    )
    p.add_argument(
        "--hold-file",
        help="a path every node sees (shared storage): remove it to release a job held by --hold-at-step",
    )
    p.add_argument("--timeout", type=float, default=900.0, help="seconds any single wait may take")
    p.add_argument(
        "--container-image",
        help="run every job step in this Pyxis image (a .sqsh path or a registry reference; overrides "
        "the run config's container_image; needs the spec's layers.pyxis)",
    )
    p.add_argument(
        "--container-mount",
        action="append",
        default=[],
        metavar="SRC:DST[:FLAGS]",
        help="one more container mount (repeatable), after the run dir, storage and textfile mounts",
    )
    p.add_argument(
        "--spare-nodes", type=int, default=1, help="torchrun launcher: spare nodes for the node-loss relaunch"
    )
    p.add_argument(
        "--standby-nodes",
        type=int,
        default=None,
        help="hot spare agents in the node-loss job (torchrun launcher; default 1 when a spare exists, "
        "0 = relaunch the job instead)",
    )


def add_stage_parsers(sub: Any) -> None:
    helps = {
        "baseline": "submit the training job, follow it, check loss decreasing and step time stable",
        "resume": "checkpoint at step N, cancel, resubmit with --load, check N+1 and the loss, time it",
        "fault": "kill -9 a node's trainer / lose a node; measure recovery vs a floor and stock torchrun",
        "nccl-profile": "rerun with NCCL_DEBUG=INFO into <run_dir>/nccl and summarise the logs",
        "all": "render, baseline, resume, fault, nccl-profile and the report, in one run directory",
    }
    for name in STAGE_COMMANDS:
        p = sub.add_parser(name, help=helps[name], description=helps[name])
        _common(p, config_required=name != "nccl-profile")
        if name == "nccl-profile":
            p.add_argument(
                "--parse-only", metavar="DIR", help="only parse the NCCL logs already in DIR (no job is run)"
            )
        if name == "all":
            p.add_argument("--only", help="comma-separated subset of baseline,resume,fault,nccl_profile")
        p.set_defaults(func=_stage_main, stage=name)


def _extra_for(module: str) -> str | None:
    """The optional-dependency group of this package that provides `module` (torch -> train), if any."""
    try:
        reqs = importlib.metadata.requires("lcm-runner") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for r in reqs:
        m = re.match(r"\s*([A-Za-z0-9_.-]+).*;\s*extra\s*==\s*['\"]([^'\"]+)['\"]", r)
        if m and m.group(1).lower().replace("-", "_") == module.lower().replace("-", "_"):
            return m.group(2)
    return None


def unavailable_reason(modname: str, exc: BaseException) -> str:
    """One line: which module failed to import, why, and what to do."""
    missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
    if missing and missing.split(".")[0] != "lcm_runner":
        root = missing.split(".")[0]
        extra = _extra_for(root)
        hint = (
            f"pip install -e '.[{extra}]' (or the node venv from requirements/*.lock)"
            if extra
            else "run scripts/bootstrap (the controller venv) or use the node venv"
        )
        return f"{modname} needs the Python module {root!r}, not installed in {sys.prefix}: {hint}"
    return (
        f"{modname} failed to import ({type(exc).__name__}: {exc}): "
        "a bug in this checkout, not a missing package"
    )


def _add_unavailable(sub: Any, name: str, reason: str) -> None:
    p = sub.add_parser(name, help=f"UNAVAILABLE: {reason}", add_help=False, prefix_chars="\0")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=lambda _ns: _unavailable(name, reason), unavailable=reason)


def _unavailable(name: str, reason: str) -> int:
    print(f"lcm-runner {name}: unavailable: {reason}", file=sys.stderr)
    return 2


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="lcm-runner", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="command", required=True, metavar="command")
    for name, modname in EXTERNAL.items():
        try:
            mod = importlib.import_module(modname)
        except Exception as exc:  # ImportError, or a broken module: say so instead of hiding the command
            reason = unavailable_reason(modname, exc)
            if not isinstance(exc, ModuleNotFoundError) or (exc.name or "").startswith("lcm_runner"):
                print(f"lcm-runner: warning: `lcm-runner {name}` unavailable: {reason}", file=sys.stderr)
            _add_unavailable(sub, name, reason)
            continue
        mod.add_parser(sub)
        if name not in sub.choices:
            raise RuntimeError(f"{modname}.add_parser registered no {name!r} subcommand (see cli.EXTERNAL)")
    add_stage_parsers(sub)
    return ap


# ----------------------------------------------------------------------------- stage commands


def make_run_dir(ns: argparse.Namespace, cfg: RunConfig) -> Path:
    from lcm_runner.render import new_run_dir

    run_dir = Path(ns.run_dir) if ns.run_dir else new_run_dir(ns.runs_root, cfg.name)
    run_dir = run_dir.resolve()
    for sub in ("logs", "telemetry", "stages"):
        (run_dir / sub).mkdir(parents=True, exist_ok=True)
    return run_dir


def make_context(ns: argparse.Namespace) -> Any:
    """Config + spec + launcher + run dir, all checked before anything starts."""
    from lcm_runner.stages.common import Progress, StageContext

    cfg = with_container(
        load_run_config(ns.config), getattr(ns, "container_image", None), getattr(ns, "container_mount", None)
    )
    launcher_name = ns.launcher or cfg.launcher
    cluster = load_cluster(ns.inventory) if ns.inventory else None
    if launcher_name == "slurm" and cluster is None:
        raise UsageError(
            "the slurm launcher needs --inventory (the cluster spec the sbatch is rendered from)"
        )
    if cfg.container_image and launcher_name != "slurm":
        raise UsageError(
            f"container image {cfg.container_image}: only the slurm launcher runs jobs in containers "
            "(srun --container-image through Pyxis); the local torchrun launcher would ignore it"
        )
    if ns.step_sleep_ms < 0 or ns.timeout <= 0 or ns.spare_nodes < 0:
        raise UsageError("--step-sleep-ms and --spare-nodes must be >= 0, --timeout > 0")
    if ns.hold_at_step < 0 or (ns.hold_at_step > 0) != bool(ns.hold_file):
        raise UsageError("--hold-at-step (> 0) and --hold-file go together")
    if ns.hold_file and cfg.workload.foreign:
        raise UsageError(
            f"--hold-at-step: a {cfg.workload.kind} workload runs the user's own trainer, which has no hold"
        )
    standby = ns.standby_nodes if ns.standby_nodes is not None else min(1, ns.spare_nodes)
    if launcher_name == "slurm" and ns.standby_nodes:
        raise UsageError(
            "--standby-nodes: the Slurm batch script starts no standby agent; the requeue recovers"
        )
    if ns.standby_nodes and cfg.nodes < 2:
        raise UsageError(
            f"--standby-nodes: a standby takes over a lost node of a multi-node job; this one has "
            f"{cfg.nodes} node (node 0 hosts the rendezvous store and cannot be replaced: the node loss "
            "relaunches it)"
        )
    if launcher_name == "slurm" or cfg.nodes < 2:
        standby = 0
    if not 0 <= standby <= ns.spare_nodes:
        raise UsageError(f"--standby-nodes {standby}: must be within 0..--spare-nodes ({ns.spare_nodes})")
    run_dir = make_run_dir(ns, cfg)
    env_file = None
    if cluster is not None:
        from lcm_runner.render import render_run

        out = render_run(cluster, cfg, run_dir, nccl_profile=ns.stage in ("nccl-profile", "all"))
        env_file = out.nccl_env if launcher_name == "torchrun" and cfg.uses_gpu else None
    if launcher_name == "slurm":
        from lcm_runner.launch.slurm import SlurmLauncher

        launcher: Any = SlurmLauncher(cluster or {}, cfg)
    else:
        from lcm_runner.launch.torchrun import LocalLauncher

        launcher = LocalLauncher(spare_nodes=ns.spare_nodes)
    return StageContext(
        cfg=cfg,
        run_dir=run_dir,
        launcher=launcher,
        progress=Progress(),
        agent=ns.agent or cfg.agent,
        env_file=env_file,
        cluster=cluster,
        step_sleep_ms=ns.step_sleep_ms,
        hold=(ns.hold_at_step, ns.hold_file) if ns.hold_file else None,
        timeout_s=ns.timeout,
        standby_nodes=standby,
    )


def _stage_main(ns: argparse.Namespace) -> int:
    if ns.stage == "nccl-profile" and ns.parse_only:
        from lcm_runner.nccl.cli import run as parse_run

        try:
            return parse_run(argparse.Namespace(log_dir=ns.parse_only, inventory=ns.inventory, json_out=None))
        except ValueError as e:  # ConfigError / SpecInvalid of a bad --inventory
            print(f"lcm-runner {ns.stage}: {e}", file=sys.stderr)
            return 2
    if ns.config is None:
        print(
            f"lcm-runner {ns.stage}: --config/-c is required (only --parse-only runs without it)",
            file=sys.stderr,
        )
        return 2
    try:
        ctx = make_context(ns)
    except (ConfigError, UsageError, LaunchError) as e:
        print(f"lcm-runner {ns.stage}: {e}", file=sys.stderr)
        return 2
    except ValueError as e:  # the spec validator's SpecInvalid, render's RenderError
        print(f"lcm-runner {ns.stage}: {e}", file=sys.stderr)
        return 2
    print(f"run dir: {ctx.run_dir}", flush=True)
    _print_workload(ctx.cfg)
    try:
        return _run_stage(ns, ctx)
    except KeyboardInterrupt:
        print(f"lcm-runner {ns.stage}: interrupted; stopping its jobs", file=sys.stderr)
        return 130
    finally:
        ctx.launcher.close()


def _print_workload(cfg: RunConfig) -> None:
    """A user's Megatron-LM: its script, and each argument the runner adds or overrides."""
    w = cfg.workload
    if not w.foreign:
        return
    from lcm_runner.config.argv import megatron_arg_changes

    print(f"workload: {w.kind} {w.script} ({len(w.args)} argument tokens of yours)")
    for change in megatron_arg_changes(cfg):
        print(f"workload: {change}", flush=True)


def _run_stage(ns: argparse.Namespace, ctx: Any) -> int:
    from lcm_runner.stages import all as all_stage
    from lcm_runner.stages import baseline, fault, nccl_profile, resume

    if ns.stage == "all":
        only = [s.strip() for s in ns.only.split(",")] if ns.only else None
        known = [n for n, _ in all_stage.SEQUENCE]
        if only and (bad := [s for s in only if s not in known]):
            print(f"lcm-runner all: --only {','.join(bad)}: not one of {','.join(known)}", file=sys.stderr)
            return 2
        results, report = all_stage.run(ctx, only)
        return all_stage.exit_code(results, report)
    fns: dict[str, Callable[[Any], Any]] = {
        "baseline": baseline.run,
        "resume": resume.run,
        "fault": fault.run,
        "nccl-profile": nccl_profile.run,
    }
    result = fns[ns.stage](ctx)
    return all_stage.exit_code([result])


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    ns = ap.parse_args(argv)
    return int(ns.func(ns))


if __name__ == "__main__":
    raise SystemExit(main())
