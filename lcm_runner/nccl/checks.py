"""What the NCCL logs should show for a cluster spec, and the flags raised when they do not.

Flags (severity error unless noted):
  socket_between_nodes   a NET/Socket (TCP) channel between nodes where the spec's fabric is IB/RoCE
  net_plugin_not_ib      a process chose a non-IB network plugin where the spec says IB/RoCE
  non_nvlink_intra_node  an intra-node channel over SHM or NET where the spec says NVLink (NVSwitch)
  ranks_disagree         processes differ in NCCL version, network plugin, GDR or transports by path
  nccl_warnings          NCCL printed WARN lines (severity warn)
  no_gdrdma              IB channels without GPUDirect RDMA (severity info)
  p2p_link_unverified    P2P inside a node, but nothing in the log proves NVLink (severity info)
  no_logs                no NCCL log lines were found
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from lcm_runner.nccl.logparse import Channel, Comm, ProcessLog, comm_hosts, summary_of

ERROR, WARN, INFO = "error", "warn", "info"


@dataclass(frozen=True)
class Expect:
    inter_node: str | None  # "IB" (infiniband and roce both use NCCL's IB verbs transport), "Socket", None
    nvlink: bool  # intra-node traffic must go over NVLink

    @classmethod
    def from_cluster(cls, cluster: dict[str, Any] | None) -> Expect:
        if not cluster:
            return cls(None, False)
        fabric = str(cluster.get("fabric", {}).get("type", ""))
        inter = "IB" if fabric in ("infiniband", "roce") else "Socket" if fabric == "ethernet" else None
        gpu = cluster.get("gpu", {})
        return cls(inter, bool(gpu.get("nvswitch")) and int(gpu.get("count_per_node", 0)) > 1)


@dataclass(frozen=True)
class Flag:
    code: str
    severity: str
    detail: str
    ranks: tuple[int | str, ...] = ()


def _who(log: ProcessLog) -> int | str:
    return log.rank if log.rank is not None else f"{log.host}:{log.pid}"


def classify(logs: list[ProcessLog]) -> dict[int, dict[str, set[str]]]:
    """Per process (index): the transport kinds of its intra-node and inter-node channels."""
    hosts = comm_hosts(logs)
    out: dict[int, dict[str, set[str]]] = {}
    for i, log in enumerate(logs):
        paths: dict[str, set[str]] = {"intra": set(), "inter": set()}
        for ch in log.channels:
            paths[_path_of(log, ch, hosts)].add(ch.kind)
        out[i] = paths
    return out


def _path_of(log: ProcessLog, ch: Channel, hosts: dict[tuple[str, int], str]) -> str:
    comm = log.comms.get(ch.comm_ptr or "")
    if comm is not None and comm.comm_id is not None:
        a, b = hosts.get((comm.comm_id, ch.src)), hosts.get((comm.comm_id, ch.dst))
        if a is not None and b is not None:
            return "intra" if a == b else "inter"
    if comm is not None and comm.nnodes == 1:
        return "intra"
    return "inter" if ch.kind.startswith("NET/") else "intra"


def check(logs: list[ProcessLog], expect: Expect) -> list[Flag]:
    flags: list[Flag] = []
    if not logs or not any(log.nccl_lines for log in logs):
        return [
            Flag("no_logs", ERROR, "no NCCL log lines found (was NCCL_DEBUG=INFO and NCCL_DEBUG_FILE set?)")
        ]
    paths = classify(logs)
    hosts = comm_hosts(logs)
    for i, log in enumerate(logs):
        who = _who(log)
        intra, inter = paths[i]["intra"], paths[i]["inter"]
        if expect.inter_node == "IB":
            socket = sorted(k for k in inter if k.startswith("NET/Socket"))
            if socket:
                n = sum(1 for ch in log.channels if ch.kind.startswith("NET/Socket"))
                flags.append(
                    Flag(
                        "socket_between_nodes",
                        ERROR,
                        f"rank {who}: {n} inter-node channel(s) over TCP sockets (NET/Socket) "
                        "where the spec's fabric is InfiniBand/RoCE (NCCL_IB_HCA / IB devices?)",
                        (who,),
                    )
                )
            if log.net_plugin is not None and not log.net_plugin.startswith("IB"):
                multi = any(_spans_hosts(c, hosts) for c in log.comms.values())
                flags.append(
                    Flag(
                        "net_plugin_not_ib",
                        ERROR if multi else WARN,
                        f"rank {who}: network plugin {log.net_plugin} where the spec says InfiniBand"
                        + ("" if multi else " (single-node communicators only)"),
                        (who,),
                    )
                )
            no_gdr = sorted(k for k in inter if k == "NET/IB")
            if no_gdr:
                flags.append(
                    Flag("no_gdrdma", INFO, f"rank {who}: NET/IB channels without GPUDirect RDMA", (who,))
                )
        if expect.nvlink:
            slow = sorted(k for k in intra if k == "SHM" or k.startswith("NET/"))
            if slow:
                flags.append(
                    Flag(
                        "non_nvlink_intra_node",
                        ERROR,
                        f"rank {who}: intra-node channel(s) via {', '.join(slow)} where the spec says "
                        "NVLink (NVSwitch)",
                        (who,),
                    )
                )
            if any(k.startswith("P2P") for k in intra):
                proven = log.env.get("NCCL_P2P_LEVEL", "").upper() == "NVL" or log.nvlink_in_topology
                if not proven:
                    flags.append(
                        Flag(
                            "p2p_link_unverified",
                            INFO,
                            f"rank {who}: P2P inside the node, but neither NCCL_P2P_LEVEL=NVL nor an NVL "
                            "link in the topology dump proves it is NVLink",
                            (who,),
                        )
                    )
        if log.warnings:
            flags.append(
                Flag(
                    "nccl_warnings",
                    WARN,
                    f"rank {who}: {len(log.warnings)} NCCL WARN line(s), e.g. {log.warnings[0][:160]!r}",
                    (who,),
                )
            )
    flags += _disagreements(logs, paths)
    return flags


def _spans_hosts(comm: Comm, hosts: dict[tuple[str, int], str]) -> bool:
    """Whether a communicator has ranks on more than one host (NCCL's nNodes when peers' logs are missing).

    NCCL's own nNodes is not enough: with P2P and SHM disabled it counts every GPU of one host as a node.
    """
    if comm.comm_id is not None and comm.nranks is not None:
        seen = {hosts.get((comm.comm_id, r)) for r in range(comm.nranks)}
        if None not in seen:
            return len(seen) > 1
    return (comm.nnodes or 1) > 1


def _disagreements(logs: list[ProcessLog], paths: dict[int, dict[str, set[str]]]) -> list[Flag]:
    out: list[Flag] = []
    aspects = {
        "NCCL version": lambda i: logs[i].nccl_version,
        "network plugin": lambda i: logs[i].net_plugin,
        "GDR": lambda i: logs[i].ring_gdr,
        "intra-node transports": lambda i: ",".join(sorted(paths[i]["intra"])) or None,
        "inter-node transports": lambda i: ",".join(sorted(paths[i]["inter"])) or None,
    }
    for aspect, value in aspects.items():
        groups: dict[str, list[int | str]] = {}
        for i in range(len(logs)):
            v = value(i)
            if v is not None:
                groups.setdefault(str(v), []).append(_who(logs[i]))
        if len(groups) > 1:
            detail = "; ".join(f"{v}: ranks {', '.join(map(str, rs))}" for v, rs in sorted(groups.items()))
            out.append(
                Flag(
                    "ranks_disagree",
                    ERROR,
                    f"{aspect} differs between ranks: {detail}",
                    tuple(r for rs in groups.values() for r in rs),
                )
            )
    return out


def profile_summary(logs: list[ProcessLog], expect: Expect) -> dict[str, Any]:
    """The nccl_profile stage's metrics: per-rank facts, flags, and `ok` (no error flags)."""
    flags = check(logs, expect)
    paths = classify(logs) if logs else {}
    ranks = []
    for i, log in enumerate(logs):
        s = summary_of(log)
        s["intra_node"] = sorted(paths[i]["intra"])
        s["inter_node"] = sorted(paths[i]["inter"])
        ranks.append(s)
    ranks.sort(
        key=lambda s: (s["rank"] is None, s["rank"] if s["rank"] is not None else 0, s["host"], s["pid"])
    )
    return {
        "files": len(logs),
        "expect": asdict(expect),
        "net_plugins": sorted({s["net_plugin"] for s in ranks if s["net_plugin"]}),
        "transports": sorted({k for s in ranks for k in s["transports"]}),
        "algos": sorted({f"{c}:{a}" for s in ranks for c, d in s["algos"].items() for a in d}),
        "warnings": sum(len(s["warnings"]) for s in ranks),
        "ranks": ranks,
        "flags": [{**asdict(f), "ranks": list(f.ranks)} for f in flags],
        "ok": not any(f.severity == ERROR for f in flags),
    }
