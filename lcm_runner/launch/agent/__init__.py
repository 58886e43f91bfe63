"""lcm-agent: one per node. A pre-imported zygote that forks the node's training ranks and restarts
them in place when any rank on any node fails.

Why not stock torchrun: its restart re-execs every worker, so each recovery pays interpreter start and
the torch + megatron imports again (seconds on a busy CPU), and its monitor waits for the whole worker
group before the rendezvous round. This agent

- imports torch, torch.distributed and the trainer's modules ONCE, before any thread or CUDA context
  exists, then ``fork()``s the ranks from that warm image (a zygote, as Android's app launcher does);
- watches its ranks with ``waitpid`` every 20 ms and publishes a failure at once in a small TCPStore
  (hosted by the node-0 agent) that every agent polls, so a kill on one node is seen by the others
  in tens of milliseconds without waiting for a collective to time out;
- tears the ranks down by process group (``killpg`` SIGKILL: the rank and the multiprocessing helpers
  it started), as a child subreaper so nothing is re-parented away, and checks that nothing tagged for
  this node is left before it forks the next generation;
- gives every generation a fresh rendezvous port for the ranks' own store (the stale-peer bug of
  torchrun's shared TCPStore with gloo cannot happen);
- heartbeats through the store: a node whose agent stops (node loss) is declared lost after
  ``hb_timeout_s`` and every survivor tears down and exits ``NODE_LOST`` (76) within that bound, so
  the scheduler (Slurm requeue / the local launcher) relaunches from the last checkpoint instead of
  a survivor waiting for the default rendezvous/NCCL timeouts.

The trainer runs unchanged: the rank executes ``python -m <module> <args>`` semantics through
``runpy`` with the usual torchrun environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT,
TORCHELASTIC_RESTART_COUNT = generation). Events go to ``--events`` (JSON lines) for the stages.

The package, one module per concern: config.py (AgentConfig, --node-devices), store.py (the job's
TCPStore and the names of its keys), membership.py (heartbeats, lost peers), standby.py (hot standby
takeover), ranks.py (fork/exec, reap, signal forwarding, teardown of the ranks), policy.py (how a
generation ends and the exit code), core.py (Agent: rendezvous, monitor, the generation loop),
cli.py (the command line), events.py (the JSON-lines event log). Exit codes: lcm_runner.contracts.
"""

from lcm_runner.contracts import AgentExit
from lcm_runner.launch.agent.cli import build_parser, main
from lcm_runner.launch.agent.config import AgentConfig, parse_node_devices
from lcm_runner.launch.agent.core import Agent

__all__ = ["Agent", "AgentConfig", "AgentExit", "build_parser", "main", "parse_node_devices"]
