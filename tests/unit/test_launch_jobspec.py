"""One-way launch path and single sources of truth.

- the run config becomes a JobSpec once (lcm_runner.launch.jobspec.job_spec); the Slurm launcher renders
  its batch script from the JobSpec alone, identical to what the run config rendered before;
- each launch default is defined once (lcm_runner.contracts) and is that very object wherever it is a
  default;
- every exit code the batch script or the agent uses is in contracts' tables.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path
from typing import Any

import yaml

from lcm_runner import config, contracts, render
from lcm_runner.contracts import AgentExit, ExitCode
from lcm_runner.launch import agent as agent_mod
from lcm_runner.launch import procs
from lcm_runner.launch.base import JobSpec
from lcm_runner.launch.jobspec import job_spec
from lcm_runner.launch.slurm import SlurmLauncher

ROOT = Path(__file__).resolve().parents[2]
LAB = ROOT / "inventories" / "lab"
H200 = ROOT / "inventories" / "example-h200"
LAUNCH = ROOT / "lcm_runner" / "launch"


def _cfg(name: str, **over: object) -> config.RunConfig:
    data = yaml.safe_load((ROOT / "configs" / name).read_text())
    data.update(over)
    return config.from_dict(data)


def _default(cls: type, name: str) -> Any:
    return {f.name: f for f in dataclasses.fields(cls)}[name].default


# ----------------------------------------------------------------------------- defaults


def test_each_launch_default_is_one_object() -> None:
    parser = agent_mod.build_parser()
    where = {
        contracts.DEFAULT_JOIN_TIMEOUT_S: [
            _default(JobSpec, "join_timeout_s"),
            _default(agent_mod.AgentConfig, "join_timeout_s"),
            parser.get_default("join_timeout"),
        ],
        contracts.DEFAULT_HB_TIMEOUT_S: [
            _default(JobSpec, "hb_timeout_s"),
            _default(agent_mod.AgentConfig, "hb_timeout_s"),
            parser.get_default("hb_timeout"),
        ],
        contracts.DEFAULT_MAX_RESTARTS: [
            _default(JobSpec, "max_restarts"),
            _default(agent_mod.AgentConfig, "max_restarts"),
            parser.get_default("max_restarts"),
        ],
        contracts.DEFAULT_HB_INTERVAL_S: [_default(agent_mod.AgentConfig, "hb_interval_s")],
        contracts.DEFAULT_MASTER_PORT: [_default(JobSpec, "master_port")],
        contracts.DEFAULT_TIME_LIMIT: [_default(JobSpec, "time_limit")],
        procs.TRAINER_MODULE: [_default(agent_mod.AgentConfig, "module"), parser.get_default("module")],
    }
    for value, uses in where.items():
        for use in uses:
            assert use is value, (use, value)


def test_run_config_defaults_agree_with_contracts() -> None:
    # lcm_runner/config/types.py takes them from lcm_runner.contracts: the very same objects
    rc = config.RunConfig
    assert _default(rc, "rdzv_join_timeout_s") is contracts.DEFAULT_JOIN_TIMEOUT_S
    assert _default(rc, "hb_timeout_s") is contracts.DEFAULT_HB_TIMEOUT_S
    assert _default(rc, "max_restarts") is contracts.DEFAULT_MAX_RESTARTS
    assert _default(rc, "master_port") is contracts.DEFAULT_MASTER_PORT
    assert _default(rc, "time_limit") is contracts.DEFAULT_TIME_LIMIT


# ----------------------------------------------------------------------------- exit codes


def _case_codes(sbatch: str) -> set[int]:
    return {int(m) for m in re.findall(r"^  (\d+)\) ", sbatch, flags=re.M)}


def test_sbatch_requeue_codes_are_contract_codes(tmp_path: Path) -> None:
    known = {int(c) for c in ExitCode} | {int(c) for c in AgentExit}
    for inv, name in ((LAB, "lab.yml"), (H200, "h200.yml")):
        for agent in ("lcm", "torchrun"):
            cfg = _cfg(name, agent=agent)
            text = render.sbatch_text(config.load_cluster(inv), cfg, tmp_path / f"{name}-{agent}")
            codes = _case_codes(text)
            assert codes == set(contracts.requeue_exit_codes(agent)), (name, agent, codes)
            assert codes <= set(contracts.REQUEUE_REASONS) <= known
            assert (int(AgentExit.NODE_LOST) in codes) == (agent == "lcm")
            assert f"{int(ExitCode.REQUEUE)})" in text
    # the codes both tables name mean the same thing
    assert AgentExit.REQUEUE == ExitCode.REQUEUE and AgentExit.BAD_ARGS == ExitCode.BAD_ARGS
    assert agent_mod.AgentExit is AgentExit  # still importable where the agent lives


def test_agent_modules_exit_only_with_named_codes() -> None:
    """No numeric exit code other than 0 (and 128 + signal) is written out in the agent's modules:
    `return 76`, `os._exit(75)` and the like must name AgentExit/ExitCode."""
    files = sorted((LAUNCH / "agent").glob("*.py"))
    assert files
    bad: list[str] = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            value = None
            if isinstance(node, ast.Return) and isinstance(node.value, ast.Constant):
                value = node.value.value
            elif (
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", "") in ("_exit", "exit")
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                value = node.args[0].value
            if isinstance(value, int) and not isinstance(value, bool) and value != 0:
                bad.append(f"{path.name}:{node.lineno}: {value}")
    assert not bad, bad


# ----------------------------------------------------------------------------- one-way JobSpec


class _FakeSlurm:
    def __init__(self) -> None:
        self.scripts: list[str] = []

    def __call__(self, argv: list[str], timeout: float, check: bool, env: dict[str, str] | None) -> str:
        if argv[0] == "sbatch":
            self.scripts.append(Path(argv[-1]).read_text())
            return f"{1000 + len(self.scripts)}\n"
        return ""


def test_slurm_submit_renders_the_jobspec_as_the_run_config_did(tmp_path: Path) -> None:
    cluster = config.load_cluster(H200)
    cfg = _cfg("h200.yml")
    fake = _FakeSlurm()
    launcher = SlurmLauncher(cluster, cfg, run_cmd=fake)
    run_dir = tmp_path / "run"
    for agent, restarts, env in (("lcm", None, {}), ("torchrun", 0, {"NCCL_DEBUG": "INFO"})):
        args = ["--train-iters", "7", "--save", str(run_dir / "ckpt")]
        spec = job_spec(
            cfg, name=f"s-{agent}", run_dir=run_dir, train_args=args, python=cfg.python,
            agent=agent, max_restarts=restarts, env=env,
        )  # fmt: skip
        launcher.submit(spec)
        # what submit rendered before the path was one-way: the run config, with the launch's agent
        # and restart budget folded back into it
        folded = dataclasses.replace(cfg, agent=spec.agent, max_restarts=spec.max_restarts)
        want = render.sbatch_text(
            cluster, folded, run_dir, train_args=args, nccl_profile=bool(env), job_name=f"lcm-s-{agent}"
        )
        assert fake.scripts[-1] == want
    assert "--max-restarts 0" in fake.scripts[-1] and "NCCL_DEBUG=INFO" in fake.scripts[-1]


def test_job_spec_carries_the_run_config(tmp_path: Path) -> None:
    cfg = _cfg("h200.yml")
    spec = job_spec(cfg, name="x", run_dir=tmp_path, train_args=["--a"], python="py")
    assert (spec.nodes, spec.procs_per_node, spec.gpus_per_node) == (
        cfg.nodes,
        cfg.procs_per_node,
        cfg.gpus_per_node,
    )
    assert (spec.agent, spec.max_restarts, spec.master_port) == (cfg.agent, cfg.max_restarts, cfg.master_port)
    assert spec.join_timeout_s == float(cfg.rdzv_join_timeout_s) and spec.hb_timeout_s == cfg.hb_timeout_s
    assert (spec.time_limit, spec.partition, spec.python) == (cfg.time_limit, cfg.partition, "py")
    assert (spec.container_image, spec.container_mounts) == (cfg.container_image, cfg.container_mounts)
    over = job_spec(cfg, name="x", run_dir=tmp_path, train_args=[], python="py", agent="lcm", max_restarts=0)
    assert (over.agent, over.max_restarts) == ("lcm", 0)
