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

# host:pid:tid [cudaDev] NCCL INFO|WARN|TRACE message   (optionally prefixed by an mpirun "[r] " tag);
# WARN lines carry the source location before NCCL: "host:pid:tid [0] misc/socket.cc:49 NCCL WARN ..."
LINE = re.compile(
    r"^(?:\[\d+\]\s+)?(?P<host>[^\s:]+):(?P<pid>\d+):(?P<tid>\d+)\s+\[(?P<dev>\d+)\]\s+"
    r"(?:(?P<src>[\w./+-]+:\d+)\s+)?NCCL\s+(?P<level>INFO|WARN|TRACE)\s?(?P<msg>.*)$"
)
VERSION = re.compile(r"^NCCL version (?P<v>\S+)")
USING_NETWORK = re.compile(r"^Using network (?P<net>\S+)")
NET_INIT = re.compile(r"^Initialized NET plugin (?P<net>\S+)")
IB_USING = re.compile(r"^NET/IB\s*:\s*Using (?P<devs>.*?)(?:\s*;\s*OOB\s+(?P<oob>\S+))?$")
IB_DEV = re.compile(r"\[\d+\](?P<dev>[\w.-]+):(?P<port>\d+)/(?P<link>\w+)")
GDR_HCA = re.compile(r"GPU Direct RDMA (?P<state>Enabled|Disabled) for HCA (?P<n>\d+) '(?P<hca>[^']+)'")
INIT_START = re.compile(
    r"^ncclCommInit\w* comm (?P<ptr>0x[0-9a-f]+) rank (?P<rank>\d+) nranks (?P<nranks>\d+) "
    r"cudaDev (?P<dev>\d+)"
    r".*?busId (?P<bus>[0-9a-fx]+) commId (?P<cid>0x[0-9a-f]+)",
    re.IGNORECASE,
)
COMM = re.compile(
    r"^comm (?P<ptr>0x[0-9a-f]+) rank (?P<rank>\d+) nRanks (?P<nranks>\d+) nNodes (?P<nnodes>\d+) "
    r"localRanks (?P<local>\d+) localRank (?P<localrank>\d+)"
)
# Channel 00/0 : 0[0] -> 1[1] [send] via NET/IB/0/GDRDMA
# Channel 01 : 2[c7000] -> 0[87000] via SHM/direct/direct
CHANNEL = re.compile(
    r"^Channel (?P<ch>\d+)(?:/\d+)? : (?P<src>\d+)\[(?P<srcdev>[0-9a-fx]+)\] -> "
    r"(?P<dst>\d+)\[(?P<dstdev>[0-9a-fx]+)\]"
    r"(?: \[(?P<dir>send|receive)\])? via (?P<via>\S+(?: pointer)?)"
)
RING_INFO = re.compile(r"^Connected all rings(?:, use ring PXN (?P<pxn>\d) GDR (?P<gdr>\d))?")
ALGO_NAMED = re.compile(
    r"^(?P<coll>\w+): (?P<bytes>\d+) Bytes -> Algo (?P<algo>\w+) proto (?P<proto>\w+)"
    r"(?: channel\{Lo\.\.Hi\}=\{(?P<lo>\d+)\.\.(?P<hi>\d+)\})?"
)
ALGO_NUMERIC = re.compile(r"^(?P<bytes>\d+) Bytes -> Algo (?P<algo>\d+) proto (?P<proto>\d+)")
# A communicator's lifecycle, as init.cc prints it (2.12+; commId from 2.15 on):
#   ncclCommInitRankConfig comm 0x1c49eb20 rank 1 nranks 2 cudaDev 1 nvmlDev 1 busId 70 commId 0x56..
#     - Init START                                                         (and - Init COMPLETE)
#   comm 0x1c49eb20 rank 1 nRanks 2 cudaDev 1 busId 70 - Abort START        (ncclCommAbort)
#   comm 0x26bbd260 rank 1 nranks 2 cudaDev 1 busId 70 - Destroy COMPLETE   (ncclCommDestroy)
LIFECYCLE = re.compile(
    r"^(?:ncclComm\w+ )?comm (?P<ptr>0x[0-9a-f]+) rank (?P<rank>\d+) n[Rr]anks (?P<nranks>\d+) "
    r"cudaDev (?P<dev>\d+)(?P<rest>.*?) - (?P<what>Init START|Init COMPLETE|Abort START|Abort COMPLETE|"
    r"Destroy COMPLETE)\s*$"
)
COMM_ID = re.compile(r"commId (?P<cid>0x[0-9a-f]+)")
BOOTSTRAP = re.compile(r"^Bootstrap\s*:")
CONNECTED = re.compile(r"^Connected (?:all (?:rings|trees)|NVLS|binomial trees|collnet)")
# NCCL_DEBUG_SUBSYS=COLL: "AllReduce: opCount 0 sendbuff 0x.. recvbuff 0x.. count 1 datatype 7 op 0 root 0
# comm 0x55d0 [nranks=2] stream 0x.."
COLL_OP = re.compile(r"^(?P<coll>\w+): opCount (?P<op>[0-9a-f]+)\b")
# NCCL lines (WARN, or the error-path INFO lines) that mean a communicator failed. Texts as NCCL 2.1x-2.2x
# prints them (misc/socket.cc, proxy.cc, transport/net_ib.cc, init.cc), e.g. in
#   https://github.com/NVIDIA/nccl/issues/1920  "misc/socket.cc:46 NCCL WARN socketProgressOpt: Call to send
#                                                to 10.44.137.149<52905> failed : Connection reset by peer"
#   https://github.com/NVIDIA/nccl/issues/1232  "NCCL WARN socketProgress: Connection closed by remote peer"
#   https://github.com/NVIDIA/nccl/issues/795   "NCCL WARN Net : Call to recv from ... failed : Broken pipe",
#                                               "NCCL WARN Net : Connection closed by remote peer ..."
#   https://github.com/NVIDIA/nccl-tests/issues/166  "NCCL WARN Socket recv failed while polling for ..",
#                                               "NCCL WARN [Proxy Service 0] Failed to execute operation ..."
#   https://github.com/NVIDIA/nccl/issues/957   "NCCL WARN [Service thread] Error encountered progressing ..."
#   https://github.com/NVIDIA/nccl/issues/1814  "NCCL WARN NET/IB : Got completion from peer ... status=12"
#   https://github.com/NVIDIA/nccl/issues/1039  "comm 0x.. rank 2 nranks 4 ... - Abort COMPLETE" after
#                                               "unhandled system error"
# Connect retries are INFO ("Call to connect returned Connection refused, retrying") and not errors: NCCL
# retries ECONNREFUSED/ETIMEDOUT silently up to a limit and only then WARNs
# (https://github.com/NVIDIA/nccl/issues/1515); so the socket texts count on WARN lines only.
FATAL_NCCL_WARN = re.compile(
    r"Connection closed by remote peer|Connection reset by peer|Connection refused|Connection timed out|"
    r"Broken pipe|Software caused connection abort|Call to (?:recv|send|connect)\b.*failed|"
    r"socketStartConnect|socketProgress|Socket recv failed|Failed to execute operation|"
    r"Error encountered progressing|Got completion from peer|Abort|abort|async(?:hronous)? error|"
    r"Cuda failure|unhandled (?:system|cuda) error|remote process exited|timed out|timeout|"
    r"nccl(?:Remote|System|Internal|UnhandledCuda)Error"
)
FATAL_NCCL_ANY = re.compile(
    r"nccl(?:Remote|System|Internal|UnhandledCuda)Error|unhandled (?:system|cuda) error|"
    r"remote process exited or there was a network error"
)
# torch's ProcessGroupNCCL (stderr; in the file when NCCL_DEBUG_FILE is unset), e.g.
#   [rank1]:[E626 06:24:44.903881913 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation
#   timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE, ...) ran for 600020 milliseconds before timing out.
# (https://github.com/pytorch/pytorch/issues/118369, https://github.com/NVIDIA/Megatron-LM/issues/1207),
# "NCCL communicator was aborted on rank 1. Original reason for failure was: ..."
# (https://github.com/pytorch/pytorch/pull/64241), "NCCL error in: ... unhandled system error".
FATAL_TORCH = re.compile(
    r"Watchdog caught collective operation timeout|Exception \(either an error or timeout\) detected by "
    r"watchdog|watchdog thread terminated with exception|NCCL communicator was aborted|"
    r"ProcessGroupNCCL's watchdog got stuck|NCCL error\b|DistBackendError|"
    r"nccl(?:Remote|System|Internal|UnhandledCuda)Error|unhandled (?:system|cuda) error|"
    r"remote process exited or there was a network error"
)
TORCH_RANK = re.compile(r"\[rank(?P<r>\d+)\]:|\[(?:PG [^\]]*?)?Rank (?P<r2>\d+)\]")
TORCH_PG = re.compile(r"\[(?P<pg>PG (?:ID )?[^\]]*?) Rank \d+\]")
ENV_SET = re.compile(r"^(?P<name>NCCL_\w+) set by environment to (?P<value>.*?)\.?$")
NVL_LINK = re.compile(r"\+ NVL\[")

# include/nccl_common.h (NCCL_ALGO_* and NCCL_PROTO_* indices)
ALGO_NAMES = {
    0: "TREE",
    1: "RING",
    2: "COLLNET_DIRECT",
    3: "COLLNET_CHAIN",
    4: "NVLS",
    5: "NVLS_TREE",
    6: "PAT",
}
PROTO_NAMES = {0: "LL", 1: "LL128", 2: "SIMPLE"}


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
