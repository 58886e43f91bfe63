"""GPU placement of the local launcher's emulated nodes, and what a hot standby's ranks get on takeover.

Regression (2x H200, fault stage node_loss): the standby agent inherited one of the GPUs already in
use and, after taking over node 1, its rank ran on node 0's GPU ("Duplicate GPU detected"). Here the
real launcher's submit starts a recorder in place of the agent's interpreter (what each agent would be
started with: argv + CUDA_VISIBLE_DEVICES), and the real agent code parses that argv, joins a real
TCPStore, claims the takeover a survivor posts and computes its rank's environment. CPU only: the
devices are CUDA_VISIBLE_DEVICES strings, nothing touches a GPU.
"""

from __future__ import annotations

import socket
import stat
from pathlib import Path

import pytest

from lcm_runner.launch import agent as agent_mod
from lcm_runner.launch.base import JobSpec, LaunchError
from lcm_runner.launch.torchrun import LocalLauncher

RECORDER = """#!/bin/sh
{ echo "${CUDA_VISIBLE_DEVICES-<unset>}"; printf '%s\\n' "$@"; } > "$LCM_TEST_RECORD/$LCM_NODE"
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spec(tmp_path: Path, standby: int, gpus: int = 1) -> JobSpec:
    rec = tmp_path / "record"
    rec.mkdir(exist_ok=True)
    python = tmp_path / "recorder.sh"
    python.write_text(RECORDER)
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    return JobSpec(
        name="dev",
        run_dir=tmp_path / "run",
        train_args=["--train-iters", "1"],
        nodes=2,
        procs_per_node=1,
        gpus_per_node=gpus,
        standby_nodes=standby,
        python=str(python),
        env={"LCM_TEST_RECORD": str(rec)},
    )


def _submit(launcher: LocalLauncher, spec: JobSpec, nodes: list[str] | None = None) -> dict[str, list[str]]:
    """{node: [CUDA_VISIBLE_DEVICES as started, *agent argv after `python -m lcm_runner.launch.agent`]}"""
    job = launcher.submit(spec, nodes=nodes)
    assert launcher.wait(job, 30.0).state.finished
    out = {}
    for path in sorted((spec.run_dir.parent / "record").iterdir()):
        lines = path.read_text().splitlines()
        assert lines[1:3] == ["-m", "lcm_runner.launch.agent"]
        out[path.name] = [lines[0], *lines[3:]]
        path.unlink()
    return out


def _agent(argv: list[str], port: int) -> agent_mod.Agent:
    """The agent the launcher would have started (its real parser and config), on a test port."""
    ns = agent_mod.build_parser().parse_args(argv)
    cfg = agent_mod.AgentConfig(
        nnodes=ns.nnodes,
        node_rank=ns.node_rank,
        nproc_per_node=ns.nproc_per_node,
        master_addr=ns.master_addr,
        master_port=port,
        max_restarts=ns.max_restarts,
        hb_timeout_s=ns.hb_timeout,
        join_timeout_s=5.0,
        standby=ns.standby,
        node_devices=agent_mod.parse_node_devices(ns.node_devices),
    )
    return agent_mod.Agent(cfg)


def test_standby_without_free_gpus_takes_over_the_lost_nodes_devices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # the 2-GPU box: no GPU left for a spare
    started = _submit(LocalLauncher(spare_nodes=1), _spec(tmp_path, standby=1))
    assert sorted(started) == ["local0", "local1", "local2"]
    assert started["local0"][0] == "0" and started["local1"][0] == "1"
    assert "--node-devices" not in started["local0"] + started["local1"]  # real nodes keep their own
    standby_argv = started["local2"][1:]
    assert "--standby" in standby_argv
    assert standby_argv[standby_argv.index("--node-devices") + 1] == "0=0;1=1"

    port = _free_port()
    node0 = _agent(started["local0"][1:], port)
    standby = _agent(standby_argv, port)
    node0.connect()
    standby.connect()
    seen = standby._announce("spare")
    assert standby._claim_takeover(seen, "spare") == (seen, False)  # nothing asked yet
    assert node0._request_takeover(1, 1)  # node 1 lost: a survivor asks for the standby
    assert standby._claim_takeover(seen, "spare") == (seen + 1, True)
    env = standby.rank_env(0)
    assert (env["RANK"], env["NODE_RANK"], env["TORCHELASTIC_RESTART_COUNT"]) == ("1", "1", "1")
    assert env["CUDA_VISIBLE_DEVICES"] == "1"  # node 1's GPU, free once node 1 is dead; never node 0's
    assert "CUDA_VISIBLE_DEVICES" not in node0.rank_env(0)  # inherits its agent's "0"


def test_standby_with_free_gpus_uses_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    started = _submit(LocalLauncher(spare_nodes=1), _spec(tmp_path, standby=1, gpus=2))
    # 4 GPUs, 2 nodes x 2: none free for the spare; it keeps the launcher's view (its zygote never
    # initialises CUDA) and gets the map instead
    assert [started[n][0] for n in ("local0", "local1", "local2")] == ["4,5", "6,7", "4,5,6,7"]
    argv = started["local2"]
    assert argv[argv.index("--node-devices") + 1] == "0=4,5;1=6,7"

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
    started = _submit(LocalLauncher(spare_nodes=1), _spec(tmp_path, standby=1))
    assert [started[n][0] for n in ("local0", "local1", "local2")] == ["0", "1", "2"]
    assert "--node-devices" not in started["local2"]  # a spare GPU of its own, as a real spare node
    sb = _agent(started["local2"][1:], _free_port())
    sb.cfg.node_rank = 1
    assert "CUDA_VISIBLE_DEVICES" not in sb.rank_env(0)


def test_relaunch_on_a_spare_label_gets_the_slot_it_fills(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    started = _submit(LocalLauncher(spare_nodes=1), _spec(tmp_path, standby=0), nodes=["local0", "local2"])
    assert {n: v[0] for n, v in started.items()} == {"local0": "0", "local2": "1"}


def test_too_few_gpus_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(LaunchError, match="need 2 GPUs, 1 visible"):
        LocalLauncher().submit(_spec(tmp_path, standby=1))
    assert not (tmp_path / "run" / "logs").exists() or not any((tmp_path / "run" / "logs").iterdir())


def test_node_devices_parsing() -> None:
    assert agent_mod.parse_node_devices("0=0,1;1=2,3") == {0: "0,1", 1: "2,3"}
    assert agent_mod.parse_node_devices("") == {}
    for bad in ("0", "x=1", "0=", "0=1;0=2"):
        with pytest.raises(ValueError, match="--node-devices"):
            agent_mod.parse_node_devices(bad)
    with pytest.raises(ValueError, match="node_devices names nodes"):
        agent_mod.AgentConfig(
            nnodes=2, node_rank=0, nproc_per_node=1, master_addr="127.0.0.1", master_port=29500,
            node_devices={0: "0"},
        ).validate()  # fmt: skip
    assert agent_mod.main(["--nnodes", "2", "--nproc-per-node", "1", "--master-addr", "x",
                           "--master-port", "29500", "--node-devices", "nope"]) == 2  # fmt: skip
