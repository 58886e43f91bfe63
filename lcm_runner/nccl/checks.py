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
A failed run (each names the rank, host:pid, the communicator and the log line that shows it):
  comm_error             a line saying a communicator failed: a fatal NCCL WARN (socket closed/reset/refused/
                         timed out, proxy/IB errors, Abort), ncclRemoteError/ncclSystemError/"unhandled system
                         error", torch's ProcessGroupNCCL watchdog timeout / "communicator was aborted"
  comm_aborted           a communicator aborted (ncclCommAbort: "- Abort START|COMPLETE") in a process with
                         error lines, or before its Init COMPLETE. An abort with neither is torch tearing its
                         process groups down (ProcessGroupNCCL's destructor aborts the communicators it was
                         not asked to destroy; the real healthy H200 pair shows one): listed in the rank's
                         summary ("aborted"), not flagged
  init_incomplete        a process stopped mid-initialisation: Init START without Init COMPLETE for that
                         communicator, or a Bootstrap line and no communicator at all
  ranks_missing          a communicator of nranks N of which fewer ranks' logs were found (names the missing)
  no_collective          a rank whose log shows no collective: no channel connection line (NCCL 2.22+
                         connects on first use), no "Connected all rings/trees", no TUNING algo line, no COLL
                         opCount line
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
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
    comm: str = ""  # the communicator ("comm 0x.. (commId 0x..)"), where the flag is about one
    where: str = ""  # host:pid of the process (file name when the log had no NCCL line)
    line: str = ""  # the log line that shows it, truncated


LINE_MAX = 200


def _cut(text: str, n: int = LINE_MAX) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


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
    flags += failed_run(logs)
    return flags


def _where(log: ProcessLog) -> str:
    return f"{log.host}:{log.pid}" if log.host else Path(log.path).name


def _comm_label(log: ProcessLog, ptr: str | None) -> str:
    c = log.comms.get(ptr or "")
    return c.label if c is not None else (f"comm {ptr}" if ptr else "no communicator set up yet")


def failed_run(logs: list[ProcessLog]) -> list[Flag]:
    """Flags of a run that failed: error lines, aborts, ranks stopped mid-init or missing, no collective."""
    out: list[Flag] = []
    for log in logs:
        who, where = _who(log), _where(log)
        tag = f"rank {who} ({where})" if log.host and who != where else f"rank {who}"
        for ptr in dict.fromkeys(e.comm_ptr for e in log.errors):  # one flag per communicator, in order
            errs = [e for e in log.errors if e.comm_ptr == ptr]
            first = errs[0]
            comm = _comm_label(log, ptr)
            if group := next((e.group for e in errs if e.group), None):
                comm = f"{comm}; torch {group}"
            ranks = sorted({e.rank for e in errs if e.rank is not None}) or [who]
            out.append(
                Flag(
                    "comm_error",
                    ERROR,
                    f"{tag}, {comm}: {len(errs)} error line(s) "
                    f"({', '.join(sorted({e.source for e in errs}))}), "
                    f"first at line {first.lineno}: {_cut(first.text)!r}",
                    tuple(ranks),
                    comm,
                    where,
                    _cut(first.text),
                )
            )
        for c in log.comms.values():
            if c.abort and (log.errors or not c.init_complete):
                why = "after error line(s) in this log" if log.errors else "before its Init COMPLETE"
                out.append(
                    Flag(
                        "comm_aborted",
                        ERROR,
                        f"{tag}: {c.label} (rank {c.rank} of {c.nranks}) aborted {why}: {_cut(c.abort)!r}",
                        (who,),
                        c.label,
                        where,
                        _cut(c.abort),
                    )
                )
        for c in log.comms.values():
            if c.init_start and not c.init_complete:
                out.append(
                    Flag(
                        "init_incomplete",
                        ERROR,
                        f"{tag} stopped mid-initialisation of {c.label} (rank {c.rank} of {c.nranks}): "
                        f"Init START without Init COMPLETE; the log ends with {_cut(log.last_line)!r}",
                        (who,),
                        c.label,
                        where,
                        _cut(c.init_start),
                    )
                )
        if log.bootstrap and not log.comms:
            out.append(
                Flag(
                    "init_incomplete",
                    ERROR,
                    f"{tag}: NCCL bootstrapped ({_cut(log.bootstrap)!r}) but no communicator init started; "
                    f"the log ends with {_cut(log.last_line)!r}",
                    (who,),
                    "",
                    where,
                    _cut(log.bootstrap),
                )
            )
        complete = [c for c in log.comms.values() if c.init_complete]
        stopped = any(f.code == "init_incomplete" and f.where == where for f in out)
        # (a rank stopped mid-init is flagged above: not again as "no collective")
        if (log.comms or log.bootstrap) and not stopped and not log.collective_evidence:
            done = (
                f"{len(complete)} communicator(s) completed init ({', '.join(c.label for c in complete)})"
                if complete
                else "no communicator completed init"
            )
            out.append(
                Flag(
                    "no_collective",
                    ERROR,
                    f"{tag}: no collective ran: {done}, but the log has no channel connection line "
                    "('Channel NN/N : a[..] -> b[..] via ...', printed when a collective first "
                    "connects), no 'Connected all rings/trees', no TUNING 'Bytes -> Algo' and no COLL "
                    f"'opCount' line; the log ends with {_cut(log.last_line)!r}",
                    (who,),
                    ", ".join(c.label for c in complete),
                    where,
                    _cut(log.last_line),
                )
            )
    if not any(log.collective_evidence for log in logs) and not any(f.code == "no_collective" for f in out):
        out.append(
            Flag(
                "no_collective",
                ERROR,
                f"no collective ran: none of the {len(logs)} log(s) shows a communicator init, a channel "
                "connection, 'Connected all rings/trees', a TUNING algo or a COLL opCount line",
                tuple(_who(log) for log in logs),
            )
        )
    out += _missing_ranks(logs)
    return out


def _missing_ranks(logs: list[ProcessLog]) -> list[Flag]:
    """Communicators (by commId) of nranks N with fewer than N ranks among the logs found."""
    seen: dict[str, dict[int, tuple[ProcessLog, Comm]]] = {}
    nranks: dict[str, int] = {}
    for log in logs:
        for c in log.comms.values():
            if c.comm_id is None or c.rank is None or c.nranks is None:
                continue
            seen.setdefault(c.comm_id, {})[c.rank] = (log, c)
            nranks[c.comm_id] = max(nranks.get(c.comm_id, 0), c.nranks)
    out = []
    for cid, ranks in seen.items():
        missing = sorted(set(range(nranks[cid])) - set(ranks))
        if not missing:
            continue
        log, c = ranks[min(ranks)]
        have = ", ".join(f"{r} ({_where(lg)})" for r, (lg, _) in sorted(ranks.items()))
        shown = ", ".join(map(str, missing[:16])) + (
            f" and {len(missing) - 16} more" if len(missing) > 16 else ""
        )
        out.append(
            Flag(
                "ranks_missing",
                ERROR,
                f"commId {cid} (nranks {nranks[cid]}): no log of rank(s) {shown} among {len(logs)} file(s); "
                f"seen: rank(s) {have}; e.g. {_cut(c.init_start or '')!r}",
                tuple(missing),
                f"commId {cid}",
                _where(log),
                _cut(c.init_start or ""),
            )
        )
    return out


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
