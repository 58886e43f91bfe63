"""`python -m lcm_runner.launch.agent`: the agent's command line (commands.agent_argv writes it)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lcm_runner.contracts import DEFAULT_HB_TIMEOUT_S, DEFAULT_JOIN_TIMEOUT_S, DEFAULT_MAX_RESTARTS, AgentExit
from lcm_runner.launch.agent.config import AgentConfig, parse_node_devices
from lcm_runner.launch.agent.core import Agent
from lcm_runner.launch.procs import TRAINER_MODULE


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m lcm_runner.launch.agent",
        description="Per-node training agent with in-place (fork) restarts. Trainer args follow '--'.",
    )
    ap.add_argument("--nnodes", type=int, required=True)
    ap.add_argument("--node-rank", type=int, default=-1, help="this node's rank (not with --standby)")
    ap.add_argument(
        "--standby", action="store_true", help="hot spare: preload, wait, take over a lost node's rank"
    )
    ap.add_argument("--nproc-per-node", type=int, required=True)
    ap.add_argument("--master-addr", required=True)
    ap.add_argument("--master-port", type=int, required=True)
    ap.add_argument("--max-restarts", type=int, default=DEFAULT_MAX_RESTARTS)
    ap.add_argument(
        "--join-timeout", type=float, default=DEFAULT_JOIN_TIMEOUT_S, help="seconds for all nodes to (re)join"
    )
    ap.add_argument(
        "--hb-timeout",
        type=float,
        default=DEFAULT_HB_TIMEOUT_S,
        help="seconds without a peer heartbeat = lost",
    )
    ap.add_argument("--module", default=TRAINER_MODULE)
    ap.add_argument("--preload", default="", help="comma-separated modules (default: torch + trainer pkg)")
    ap.add_argument("--events", type=Path, default=None, help="JSON-lines event file")
    ap.add_argument("--log-dir", type=Path, default=None, help="rank<R>.log per rank (default: inherit)")
    ap.add_argument(
        "--node-devices",
        default="",
        help="NODE_RANK=DEVICES;... : CUDA_VISIBLE_DEVICES of each node's ranks (local launcher's standby)",
    )
    ap.add_argument(
        "--warm-ranks",
        action="store_true",
        help="keep a warm spare per local rank (its CUDA context made) to become the rank at a restart",
    )
    ap.add_argument(
        "--warm-delay",
        type=float,
        default=5.0,
        help="seconds after a generation starts before its warm spares are forked (default 5)",
    )
    ap.add_argument(
        "--host-copy",
        action="store_true",
        help="give the ranks a shared-memory directory for the host copy of the last checkpoint, so a "
        "restarted rank restores from it instead of from disk",
    )
    ap.add_argument("--host-copy-root", type=Path, default=Path("/dev/shm"), help="where (default /dev/shm)")
    ap.add_argument("train_args", nargs=argparse.REMAINDER)
    return ap


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    args = ns.train_args[1:] if ns.train_args[:1] == ["--"] else ns.train_args
    try:
        node_devices = parse_node_devices(ns.node_devices)
    except ValueError as e:
        print(f"lcm-agent: {e}", file=sys.stderr)
        return int(AgentExit.BAD_ARGS)
    cfg = AgentConfig(
        nnodes=ns.nnodes,
        node_rank=ns.node_rank,
        nproc_per_node=ns.nproc_per_node,
        master_addr=ns.master_addr,
        master_port=ns.master_port,
        max_restarts=ns.max_restarts,
        join_timeout_s=ns.join_timeout,
        hb_timeout_s=ns.hb_timeout,
        module=ns.module,
        preload=[m for m in ns.preload.split(",") if m],
        events=ns.events,
        log_dir=ns.log_dir,
        train_args=args,
        standby=ns.standby,
        node_devices=node_devices,
        warm_ranks=ns.warm_ranks,
        warm_delay_s=ns.warm_delay,
        host_copy=ns.host_copy,
        host_copy_root=ns.host_copy_root,
    )
    try:
        agent = Agent(cfg)
    except ValueError as e:
        print(f"lcm-agent: {e}", file=sys.stderr)
        return int(AgentExit.BAD_ARGS)
    return agent.run()
