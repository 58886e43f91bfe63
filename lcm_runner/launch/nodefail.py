"""What a surviving agent does under Slurm when it finds a peer node lost (heartbeat gone, or the
node-0 store unreachable): mark that node DOWN with an ``lcm:`` reason, at once.

Why: the survivors exit NODE_LOST (76) within ``hb_timeout_s``, but srun keeps waiting for the lost
node's task until slurmctld itself declares the node dead (SlurmdTimeout, 60 s here; a partitioned
node: the same). ``scontrol update nodename=<n> state=down`` makes slurmctld end the job right away
and requeue it (a batch job with ``--requeue``, ``JobRequeue=1``), and a DOWN node is not picked for
the requeued job: it restarts on the other nodes plus a spare, from the last checkpoint.

Only a node that is really gone is marked down: the lost node's slurmd port is probed first (TCP
connect, ``probe_s``); a node that still answers lost only its agent (the agent or the ranks were
killed, the node is fine), and Slurm sees that task end by itself; when slurmctld (read from the
local slurm.conf) does not answer either, this node is the one cut off and tells nobody.

The lost node comes back by itself: with ``ReturnToService=2`` a DOWN node returns when its slurmd
registers again (a restarted node), and the node watchdog of roles/slurm (``lcm-node-watchdog``)
resumes a node marked down with an ``lcm:`` reason once it reaches the controller again and passes
the health check (a partition). ``Deadman`` bounds the cut-off side: its store calls block instead
of failing, the deadman ends that agent (ranks killed, exit 76) after 2 x ``hb_timeout_s``.

Enabled by ``LCM_NODE_LOST_DOWN=1`` (the rendered batch script sets it) inside a Slurm job
(``SLURM_JOB_ID``, ``SLURM_JOB_NODELIST``); elsewhere (the local launcher, unit tests) it does
nothing. ``scontrol update`` of a node needs root or a Slurm operator: the lab's jobs run as root; on
a production cluster give the training account ``AdminLevel=Operator`` or the step waits for
SlurmdTimeout as before (the failure is recorded in the agent's event, nothing else changes).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from lcm_runner.spec.hostlist import expand

ENABLE_ENV = "LCM_NODE_LOST_DOWN"
PORT_ENV = "LCM_SLURMD_PORT"  # the slurmd port probed before a node is marked down (SlurmdPort)
REASON_PREFIX = "lcm:"  # the watchdog returns nodes with this reason to service; keep them in step
DEFAULT_SLURMD_PORT = 6818
_REASON_MAX = 200  # Slurm keeps longer reasons, sinfo/scontrol output stays readable this way

Runner = Callable[[list[str], float], "subprocess.CompletedProcess[str]"]


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def enabled(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return (
        env.get(ENABLE_ENV) == "1" and bool(env.get("SLURM_JOB_ID")) and bool(env.get("SLURM_JOB_NODELIST"))
    )


def job_hosts(nodelist: str, run: Runner = _run, timeout: float = 5.0) -> list[str]:
    """The job's host names in node-rank order (SLURM_NODEID k = the k-th name of the node list)."""
    p = run(["scontrol", "show", "hostnames", nodelist], timeout)
    if p.returncode != 0:
        raise RuntimeError(f"scontrol show hostnames {nodelist}: {(p.stderr or p.stdout).strip()[-200:]}")
    return p.stdout.split()


def reachable(host: str, port: int, timeout: float) -> bool:
    """Does anything accept a TCP connection on host:port within `timeout` (slurmd alive, network up)?"""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def controller_addr(conf: str | None = None) -> tuple[str, int] | None:
    """(host, port) of slurmctld from the local slurm.conf (SlurmctldHost=name[(addr)], SlurmctldPort),
    read without asking slurmctld (this node may be the one cut off). None when unreadable."""
    path = Path(conf or os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf")
    host, port = None, 6817
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in lines:
        key, sep, value = line.split("#", 1)[0].strip().partition("=")
        if not sep:
            continue
        if key.strip().lower() == "slurmctldhost" and host is None:
            name, _, addr = value.strip().partition("(")
            host = addr.rstrip(")").strip() or name.strip()
        elif key.strip().lower() == "slurmctldport":
            with contextlib.suppress(ValueError):
                port = int(value.strip().split("-")[0])
    return (host, port) if host else None


def node_addr(host: str, conf: str | None = None) -> str | None:
    """The NodeAddr slurm.conf gives `host` (NodeName=<names> NodeAddr=<addrs>, ranges paired in order),
    read from the local file; None without one (the name is then probed). Probing the address, not the
    name, keeps a name lookup out of the probe: a DNS that forgets a dead or cut-off node (the lab's podman
    network) answers slowly or not at all."""
    path = Path(conf or os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf")
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in lines:
        fields = {}
        for word in line.split("#", 1)[0].split():
            key, sep, value = word.partition("=")
            if sep:
                fields[key.lower()] = value
        if "nodename" not in fields or "nodeaddr" not in fields:
            continue
        try:
            names, addrs = expand(fields["nodename"]), expand(fields["nodeaddr"])
        except ValueError:  # HostlistError included
            continue
        if host in names and len(addrs) == len(names):
            return addrs[names.index(host)]
    return None


def reason_text(detail: str, job: str, node_rank: int, seen_by: str) -> str:
    where = f"job {job}, node rank {node_rank}, seen by {seen_by}"
    return f"{REASON_PREFIX} agent heartbeat lost: {detail} ({where})"[:_REASON_MAX]


def mark_lost(
    node_rank: int,
    detail: str,
    *,
    env: Mapping[str, str] | None = None,
    run: Runner = _run,
    probe: Callable[[str, int, float], bool] = reachable,
    probe_s: float = 0.5,
    controller: Callable[[str | None], tuple[str, int] | None] = controller_addr,
    address: Callable[[str, str | None], str | None] = node_addr,
    timeout: float = 5.0,
) -> dict[str, Any] | None:
    """Mark the job's node `node_rank` DOWN (when enabled and the node does not answer).

    Returns what was done, for the agent's ``node_down`` event (None when disabled): ``lost_rank``, ``node``,
    ``action`` (``down`` | ``alive`` | ``isolated`` (the controller is silent too: this node is the
    one cut off) | ``self`` | ``error``), ``ok``, ``s`` and ``error``/``reason``.
    Never raises: a failure here must not keep the survivor from exiting NODE_LOST."""
    env = os.environ if env is None else env
    if not enabled(env):
        return None
    t0 = time.monotonic()
    out: dict[str, Any] = {"lost_rank": node_rank, "node": None, "action": "error", "ok": False}
    try:
        hosts = job_hosts(env["SLURM_JOB_NODELIST"], run, timeout)
        if not 0 <= node_rank < len(hosts):
            raise RuntimeError(f"node rank {node_rank} is not in the job's {len(hosts)} node(s)")
        host = hosts[node_rank]
        out["node"] = host
        me = env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
        if host == me:
            out.update(action="self", ok=True)
            return out
        port = int(env.get(PORT_ENV) or DEFAULT_SLURMD_PORT)
        target = address(host, None) or host
        if target != host:
            out["addr"] = target
        if probe(target, port, probe_s):
            # the node answers: only its agent is gone; Slurm sees that task end without help
            out.update(action="alive", ok=True)
            return out
        ctld = controller(None)
        if ctld is not None and not probe(ctld[0], ctld[1], probe_s):
            # the controller is silent too: this node is the one cut off; nothing to tell anyone
            out.update(action="isolated", ok=True, controller=f"{ctld[0]}:{ctld[1]}")
            return out
        reason = reason_text(detail, env.get("SLURM_JOB_ID", "?"), node_rank, me)
        p = run(["scontrol", "update", f"NodeName={host}", "State=DOWN", f"Reason={reason}"], timeout)
        out.update(action="down", ok=p.returncode == 0, reason=reason)
        if p.returncode != 0:
            out["error"] = (p.stderr or p.stdout).strip()[-300:]
    except (OSError, RuntimeError, ValueError, subprocess.TimeoutExpired) as e:
        out["error"] = f"{type(e).__name__}: {e}"[-300:]
    finally:
        out["s"] = round(time.monotonic() - t0, 3)
    return out


class Deadman:
    """Bounds the agent's blocking store calls: a cut-off node's store client does not fail, it waits.

    A node cut off the network (a partition) gets no RST from node 0: TCPStore's ``add``/``check``
    block in ``recv`` until TCP gives up (minutes), so that agent would keep its ranks (and the
    job's step on that node) alive for the whole partition. The agent beats this watchdog from the
    loops that poll the store (rendezvous, monitor) while it is ``armed``; when no beat came for
    ``limit_s`` the thread calls ``on_expire`` (the agent tears its ranks down and exits NODE_LOST).
    A whole process that was descheduled (a busy node) does not count: when the thread itself woke
    up late by more than half the limit, it restarts the clock instead of firing."""

    def __init__(self, limit_s: float, on_expire: Callable[[float], None], tick_s: float = 0.25) -> None:
        self.limit_s = limit_s
        self.tick_s = tick_s
        self._on_expire = on_expire
        self._beat = time.monotonic()
        self._armed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lcm-store-deadman", daemon=True)

    def start(self) -> Deadman:
        self._thread.start()
        return self

    def beat(self) -> None:
        self._beat = time.monotonic()

    def arm(self, on: bool = True) -> None:
        self.beat()
        self._armed = on

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(self.tick_s):
            now = time.monotonic()
            if now - last > self.tick_s + self.limit_s / 2:
                self.beat()  # this process was not running: the silence says nothing about the store
            last = now
            if self._armed and now - self._beat > self.limit_s:
                self._on_expire(now - self._beat)
                return


__all__ = [
    "ENABLE_ENV",
    "REASON_PREFIX",
    "Deadman",
    "controller_addr",
    "enabled",
    "job_hosts",
    "mark_lost",
    "reachable",
    "reason_text",
]
