"""The agent's parts (lcm_runner/launch/agent/): named store keys, the exit policy, the entry point."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from lcm_runner.contracts import AgentExit, ExitCode
from lcm_runner.launch.agent import policy
from lcm_runner.launch.agent import store as keys

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "lcm_runner" / "launch" / "agent"
PREFIXES = (
    "hb/",
    "join/",
    "done/",
    "restart/",
    "lost/",
    "lost_rank/",
    "standby/",
    "takeover/",
    "takeover_by/",
    "claim/",
)


def test_store_keys_are_spelled_only_in_store_py() -> None:
    bad = []
    for path in sorted(PKG.glob("*.py")):
        if path.name == "store.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            text = None
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
            elif isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
                text = str(node.values[0].value)
            if text is not None and (text.startswith(PREFIXES) or text == "finished"):
                bad.append(f"{path.name}:{node.lineno}: {text!r}")
    assert not bad, bad


def test_key_names() -> None:
    assert (keys.heartbeat(1), keys.join(2), keys.done(2, 1)) == ("hb/1", "join/2", "done/2/1")
    assert (keys.restart(3), keys.lost(3), keys.lost_rank(3)) == ("restart/3", "lost/3", "lost_rank/3")
    assert (keys.takeover(4), keys.takeover_by(1, 2), keys.claim(4)) == (
        "takeover/4",
        "takeover_by/1/2",
        "claim/4",
    )


def test_exit_policy() -> None:
    assert policy.rank_outcome(int(ExitCode.BAD_ARGS), forwarded=True) == policy.FATAL
    assert policy.rank_outcome(1, forwarded=False) == policy.RESTART
    assert policy.rank_outcome(1, forwarded=True) is None and policy.rank_outcome(0, False) is None
    d = policy.failure_detail(1, 3, int(ExitCode.NO_GOOD_CHECKPOINT), fatal=True)
    assert d == "node1 rank3 exited 78 (NO_GOOD_CHECKPOINT, fatal)"
    assert policy.is_fatal_detail(d) and policy.fatal_code_of(d) == 78
    assert policy.fatal_code_of("garbled") == AgentExit.BAD_ARGS
    assert policy.all_exited({0}) == (policy.DONE, "")
    assert policy.all_exited({0, 75}) == (policy.REQUEUE, "[0, 75]")
    assert policy.all_exited({-15}) == (policy.SIGNALLED, "[-15]")
    kw = {"gen": 0, "max_restarts": 1, "fatal_code": 0}
    assert policy.after(policy.RESTART, "x", **kw) is None  # budget left: restart in place
    assert policy.after(policy.RESTART, "x", **{**kw, "gen": 1}) == policy.Exit(1, "restarts spent: x")
    assert policy.after(policy.LOST, "x", **kw) == policy.Exit(76, "x")
    assert policy.after(policy.REQUEUE, "x", **kw) == policy.Exit(75, "x")
    signalled = policy.Exit(1, "ranks exited [-15] after a signal")
    assert policy.after(policy.SIGNALLED, "[-15]", **kw) == signalled
    assert policy.after(policy.FATAL, "x", **kw) == policy.Exit(2, "x")
    assert policy.after(policy.FATAL, "x", **{**kw, "fatal_code": 80}) == policy.Exit(80, "x")


def test_python_dash_m_entry_point_still_runs() -> None:
    p = subprocess.run(
        [sys.executable, "-m", "lcm_runner.launch.agent", "--nnodes", "2", "--nproc-per-node", "1",
         "--master-addr", "x", "--master-port", "29500", "--node-devices", "nope"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert p.returncode == AgentExit.BAD_ARGS and "--node-devices" in p.stderr


def test_the_fast_restart_options_reach_the_agent_command_line(tmp_path: Path) -> None:
    """warm_ranks / host_copy in the run config become the agent's --warm-ranks / --host-copy (and the
    agent parses them); without them the command line is as before."""
    from lcm_runner.config import from_dict, load_run_config, to_dict
    from lcm_runner.launch.agent.cli import build_parser
    from lcm_runner.launch.commands import agent_argv
    from lcm_runner.launch.jobspec import job_spec

    base = load_run_config(REPO / "configs" / "lab.yml")
    for warm, copy in ((False, False), (True, False), (True, True)):
        cfg = from_dict({**to_dict(base), "warm_ranks": warm, "host_copy": copy})
        spec = job_spec(cfg, name="t", run_dir=tmp_path, train_args=["--x"], python="python3")
        argv = agent_argv(spec, "0", "127.0.0.1", "ev.jsonl", "logs", "rdzv")
        assert ("--warm-ranks" in argv, "--host-copy" in argv) == (warm, copy)
        ns = build_parser().parse_args(argv[3:])
        assert (ns.warm_ranks, ns.host_copy, ns.warm_delay) == (warm, copy, 5.0)
        assert ns.train_args == ["--", "--x"]
