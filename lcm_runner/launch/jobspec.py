"""The run config becomes a JobSpec here, and only here.

The launch path is one-way: run config -> `job_spec` -> JobSpec -> a launcher (local agents, or the
sbatch rendered by lcm_runner.render). The stages (`StageContext.spec`) and `lcm-runner render` both
call `job_spec`; no launcher reads the run config back out of a JobSpec.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from lcm_runner.launch.base import JobSpec

if TYPE_CHECKING:
    from lcm_runner.config import RunConfig


def job_spec(
    cfg: RunConfig,
    *,
    name: str,
    run_dir: Path,
    train_args: list[str],
    python: str,
    agent: str | None = None,
    max_restarts: int | None = None,
    env: dict[str, str] | None = None,
    env_file: Path | None = None,
    standby_nodes: int = 0,
) -> JobSpec:
    """One launch of `cfg`'s trainer: `train_args` as given (the caller picks the checkpoint dir and
    the extra flags), `python` the interpreter on the nodes; `agent`/`max_restarts` override the run
    config's for this launch (None: the run config's)."""
    return JobSpec(
        name=name,
        run_dir=run_dir,
        train_args=list(train_args),
        nodes=cfg.nodes,
        procs_per_node=cfg.procs_per_node,
        gpus_per_node=cfg.gpus_per_node,
        agent=cfg.agent if agent is None else agent,
        max_restarts=cfg.max_restarts if max_restarts is None else max_restarts,
        join_timeout_s=float(cfg.rdzv_join_timeout_s),
        hb_timeout_s=cfg.hb_timeout_s,
        master_port=cfg.master_port,
        env={**cfg.workload.env, **(env or {})},
        env_file=env_file,
        python=python,
        time_limit=cfg.time_limit,
        partition=cfg.partition,
        container_image=cfg.container_image,
        container_mounts=list(cfg.container_mounts),
        standby_nodes=standby_nodes,
        warm_ranks=cfg.warm_ranks,
        host_copy=cfg.host_copy,
        module=cfg.train_module,
        # the bridge imports no torch: preload only it (the user's script starts as its own process)
        preload=[cfg.train_module] if cfg.workload.foreign else [],
    )
