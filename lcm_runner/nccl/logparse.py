"""Parse NCCL_DEBUG=INFO logs (one file per process, NCCL_DEBUG_FILE=<dir>/nccl.%h.%p.log).

What is read, per process: NCCL version, the network plugin chosen ("Using network IB|Socket"), IB
devices and GPUDirect RDMA lines, every communicator it joined (commId, rank, nranks, nNodes,
localRanks), the per-channel transport of every connection ("Channel 00/0 : 0[0] -> 1[1] [send] via
NET/IB/0/GDRDMA", "via P2P/CUMEM", "via SHM/direct/direct", "via NET/Socket/1"...), the algorithm and
protocol choices when printed (NCCL_DEBUG_SUBSYS=TUNING: "AllReduce: 4 Bytes -> Algo TREE proto LL
channel{Lo..Hi}={0..0}", and the older numeric "Bytes -> Algo 1 proto 2 time ..."), environment
overrides ("NCCL_X set by environment to Y") and every WARN line.

What a failed run leaves, per process (read by checks.py into comm_error / comm_aborted /
init_incomplete / ranks_missing / no_collective flags): each communicator's lifecycle ("... commId X -
Init START", "- Init COMPLETE", "comm P rank R nRanks N ... - Abort START|COMPLETE", "- Destroy COMPLETE"),
the Bootstrap line, error lines (FATAL_NCCL on NCCL lines of any level, FATAL_TORCH on the other lines of
the file: torch's ProcessGroupNCCL prints there when NCCL_DEBUG_FILE is unset and stderr is captured), and
the evidence that a collective ran: channel connection lines, "Connected all rings|trees", TUNING algo
lines, NCCL_DEBUG_SUBSYS=COLL "opCount" lines.
Unknown lines are ignored; nothing is guessed.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lcm_runner.nccl.patterns import (
    ALGO_NAMED,
    ALGO_NAMES,
    ALGO_NUMERIC,
    BOOTSTRAP,
    CHANNEL,
    COLL_OP,
    COMM,
    COMM_ID,
    CONNECTED,
    ENV_SET,
    FATAL_NCCL_ANY,
    FATAL_NCCL_WARN,
    FATAL_TORCH,
    GDR_HCA,
    IB_DEV,
    IB_USING,
    INIT_START,
    LIFECYCLE,
    LINE,
    NET_INIT,
    NVL_LINK,
    PROTO_NAMES,
    RING_INFO,
    TORCH_PG,
    TORCH_RANK,
    USING_NETWORK,
    VERSION,
)


def transport_kind(via: str) -> str:
    """Normalize a `via ...` transport: P2P/CUMEM, P2P/IPC, SHM, NET/IB, NET/IB/GDRDMA, NET/Socket..."""
    parts = via.split("/")
    head = parts[0]
    if head == "P2P":
        sub = parts[1].split()[0] if len(parts) > 1 else ""
        return f"P2P/{sub}" if sub else "P2P"
    if head == "SHM":
        return "SHM"
    if head == "NET":
        name = parts[1] if len(parts) > 1 else "?"
        if name.startswith("IB"):  # IB, IBext, IBext_v8: the IB verbs transport (built in or plugin)
            name = "IB"
        gdr = "/GDRDMA" if "GDRDMA" in parts else ""
        return f"NET/{name}{gdr}"
    if head.startswith("COLLNET") or head.startswith("NVLS"):
        return head
    return head


@dataclass
class Comm:
    ptr: str
    comm_id: str | None = None
    rank: int | None = None
    nranks: int | None = None
    nnodes: int | None = None
    local_ranks: int | None = None
    cuda_dev: int | None = None
    init_start: str | None = None  # the Init START line
    init_complete: bool = False
    abort: str | None = None  # the Abort START/COMPLETE line (the last one)
    abort_complete: bool = False
    destroyed: bool = False
    coll_ops: int = 0  # NCCL_DEBUG_SUBSYS=COLL "opCount" lines naming this communicator

    @property
    def label(self) -> str:
        return f"comm {self.ptr}" + (f" (commId {self.comm_id})" if self.comm_id else "")


@dataclass
class LogError:
    """A line that says a communicator failed."""

    lineno: int
    source: str  # "nccl" (an NCCL line) or "torch" (ProcessGroupNCCL and other non-NCCL lines)
    text: str
    comm_ptr: str | None  # the communicator the line names, else the one last set up in this process
    rank: int | None = None  # the rank the line names (torch's "[rank1]:"), if any
    group: str | None = None  # torch's process group ("PG ID 0 PG GUID 0(default_pg)"), if named


@dataclass
class Channel:
    comm_ptr: str | None
    channel: int
    src: int
    dst: int
    direction: str | None
    via: str
    kind: str


@dataclass
class ProcessLog:
    """Everything read from one process's NCCL log."""

    path: str
    host: str = ""
    pid: int = 0
    cuda_dev: int | None = None
    nccl_version: str | None = None
    net_plugin: str | None = None  # "Using network <X>" (the last one)
    net_plugins_initialized: list[str] = field(default_factory=list)
    ib_devices: list[dict[str, str]] = field(default_factory=list)
    gdr_hcas: dict[str, bool] = field(default_factory=dict)
    ring_gdr: bool | None = None
    comms: dict[str, Comm] = field(default_factory=dict)  # by comm pointer
    channels: list[Channel] = field(default_factory=list)
    algos: Counter[tuple[str, str, str]] = field(default_factory=Counter)  # (coll, algo, proto)
    env: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    nvlink_in_topology: bool = False
    lines: int = 0
    nccl_lines: int = 0
    bootstrap: str | None = None  # the first "Bootstrap : Using ..." line
    errors: list[LogError] = field(default_factory=list)
    connected: int = 0  # "Connected all rings|trees" / NVLS / collnet lines (a collective connected them)
    coll_ops: int = 0  # NCCL_DEBUG_SUBSYS=COLL "opCount" lines
    last_line: str = ""  # the last non-empty line of the file

    @property
    def collective_evidence(self) -> list[str]:
        """What in the log shows that a collective (or send/recv) ran; empty when nothing does."""
        ev = []
        if self.channels:
            ev.append(f"{len(self.channels)} channel connection line(s)")
        if self.connected:
            ev.append(f"{self.connected} 'Connected all rings/trees' line(s)")
        if self.algos:
            ev.append(f"{sum(self.algos.values())} TUNING algo line(s)")
        if self.coll_ops:
            ev.append(f"{self.coll_ops} COLL opCount line(s)")
        return ev

    @property
    def world_comm(self) -> Comm | None:
        """The largest communicator this process joined (the first of that size): its rank is 'the' rank."""
        best: Comm | None = None
        for c in self.comms.values():
            if (
                c.nranks is not None
                and c.rank is not None
                and (best is None or c.nranks > (best.nranks or 0))
            ):
                best = c
        return best

    @property
    def rank(self) -> int | None:
        wc = self.world_comm
        return wc.rank if wc else None


def parse_text(text: str, path: str = "<text>") -> ProcessLog:
    log = ProcessLog(path=path)
    current: str | None = None  # the communicator being set up (channel lines belong to it)
    for raw in text.splitlines():
        log.lines += 1
        line = raw.rstrip()
        if line.strip():
            log.last_line = line.strip()
        m = LINE.match(line)
        if not m:
            if FATAL_TORCH.search(line):
                tr = TORCH_RANK.search(line)
                pg = TORCH_PG.search(line)
                log.errors.append(
                    LogError(
                        log.lines,
                        "torch",
                        line.strip(),
                        current,
                        int(tr["r"] or tr["r2"]) if tr else None,
                        pg["pg"] if pg else None,
                    )
                )
            continue
        log.nccl_lines += 1
        if not log.host:
            log.host, log.pid, log.cuda_dev = m["host"], int(m["pid"]), int(m["dev"])
        msg = m["msg"].strip()
        if m["level"] == "WARN":
            log.warnings.append(msg)
            if FATAL_NCCL_WARN.search(msg):
                log.errors.append(LogError(log.lines, "nccl", line.strip(), _named_comm(msg) or current))
            continue
        if FATAL_NCCL_ANY.search(msg):
            log.errors.append(LogError(log.lines, "nccl", line.strip(), _named_comm(msg) or current))
        if mm := LIFECYCLE.match(msg):
            c = log.comms.setdefault(mm["ptr"], Comm(mm["ptr"]))
            c.rank, c.nranks, c.cuda_dev = int(mm["rank"]), int(mm["nranks"]), int(mm["dev"])
            if cid := COMM_ID.search(mm["rest"]):
                c.comm_id = cid["cid"]
            what = mm["what"]
            if what == "Init START":
                c.init_start = line.strip()
                current = mm["ptr"]
            elif what == "Init COMPLETE":
                c.init_complete = True
                current = mm["ptr"]
            elif what.startswith("Abort"):
                c.abort = line.strip()
                c.abort_complete = c.abort_complete or what == "Abort COMPLETE"
            else:
                c.destroyed = True
        elif mm := CHANNEL.match(msg):
            log.channels.append(
                Channel(
                    current,
                    int(mm["ch"]),
                    int(mm["src"]),
                    int(mm["dst"]),
                    mm["dir"],
                    mm["via"],
                    transport_kind(mm["via"]),
                )
            )
        elif mm := INIT_START.match(msg):
            c = log.comms.setdefault(mm["ptr"], Comm(mm["ptr"]))
            c.comm_id, c.rank, c.nranks = mm["cid"], int(mm["rank"]), int(mm["nranks"])
            c.cuda_dev = int(mm["dev"])
            current = mm["ptr"]
        elif mm := COMM.match(msg):
            c = log.comms.setdefault(mm["ptr"], Comm(mm["ptr"]))
            c.rank, c.nranks = int(mm["rank"]), int(mm["nranks"])
            c.nnodes, c.local_ranks = int(mm["nnodes"]), int(mm["local"])
            current = mm["ptr"]
        elif mm := USING_NETWORK.match(msg):
            log.net_plugin = mm["net"]
        elif mm := NET_INIT.match(msg):
            if mm["net"] not in log.net_plugins_initialized:
                log.net_plugins_initialized.append(mm["net"])
        elif mm := VERSION.match(msg):
            log.nccl_version = mm["v"]
        elif mm := IB_USING.match(msg):
            log.ib_devices = [d.groupdict() for d in IB_DEV.finditer(mm["devs"])]
        elif mm := GDR_HCA.search(msg):
            log.gdr_hcas[mm["hca"]] = mm["state"] == "Enabled"
        elif mm := RING_INFO.match(msg):
            log.connected += 1
            if mm["gdr"] is not None:
                log.ring_gdr = mm["gdr"] == "1"
        elif CONNECTED.match(msg):
            log.connected += 1
        elif mm := COLL_OP.match(msg):
            log.coll_ops += 1
            if (ptr := _named_comm(msg)) in log.comms:
                log.comms[ptr].coll_ops += 1
        elif BOOTSTRAP.match(msg):
            if log.bootstrap is None:
                log.bootstrap = line.strip()
        elif mm := ALGO_NAMED.match(msg):
            log.algos[(mm["coll"], mm["algo"].upper(), mm["proto"].upper())] += 1
        elif mm := ALGO_NUMERIC.match(msg):
            algo = ALGO_NAMES.get(int(mm["algo"]), f"ALGO{mm['algo']}")
            proto = PROTO_NAMES.get(int(mm["proto"]), f"PROTO{mm['proto']}")
            log.algos[("?", algo, proto)] += 1
        elif mm := ENV_SET.match(msg):
            log.env[mm["name"]] = mm["value"]
        elif NVL_LINK.search(msg):
            log.nvlink_in_topology = True
    return log


def _named_comm(msg: str) -> str | None:
    m = re.search(r"\bcomm (0x[0-9a-f]+)", msg)
    return m[1] if m else None


def parse_file(path: str | Path) -> ProcessLog:
    p = Path(path)
    return parse_text(p.read_text(encoding="utf-8", errors="replace"), str(p))


def find_logs(directory: str | Path) -> list[Path]:
    """NCCL logs of a directory: nccl.*.log (NCCL_DEBUG_FILE=<dir>/nccl.%h.%p.log), else any *.log."""
    d = Path(directory)
    if not d.is_dir():
        raise FileNotFoundError(f"{d}: no such directory")
    files = sorted(d.glob("nccl.*.log")) or sorted(d.glob("*.log"))
    return files


def comm_hosts(logs: list[ProcessLog]) -> dict[tuple[str, int], str]:
    """(commId, rank) -> host, across every process: which node each rank of each communicator is on."""
    out: dict[tuple[str, int], str] = {}
    for log in logs:
        for c in log.comms.values():
            if c.comm_id is not None and c.rank is not None:
                out[(c.comm_id, c.rank)] = log.host
    return out


def summary_of(log: ProcessLog) -> dict[str, Any]:
    wc = log.world_comm
    algos: dict[str, dict[str, int]] = {}
    for (coll, algo, proto), n in sorted(log.algos.items()):
        algos.setdefault(coll, {})[f"{algo}/{proto}"] = n
    return {
        "file": Path(log.path).name,
        "host": log.host,
        "pid": log.pid,
        "cuda_dev": log.cuda_dev,
        "rank": log.rank,
        "nranks": wc.nranks if wc else None,
        "nnodes": wc.nnodes if wc else None,
        "communicators": len(log.comms),
        "nccl_version": log.nccl_version,
        "net_plugin": log.net_plugin,
        "ib_devices": [f"{d['dev']}:{d['port']}/{d['link']}" for d in log.ib_devices],
        "gdr": log.ring_gdr,
        "transports": dict(sorted(Counter(ch.kind for ch in log.channels).items())),
        "algos": algos,
        "env": dict(sorted(log.env.items())),
        "warnings": sorted(set(log.warnings)),
        "comms_init_complete": sum(1 for c in log.comms.values() if c.init_complete),
        "comms_init_incomplete": sorted(
            c.label for c in log.comms.values() if c.init_start and not c.init_complete
        ),
        "aborted": sorted(c.label for c in log.comms.values() if c.abort),
        "errors": len(log.errors),
        "collective_evidence": log.collective_evidence,
    }
