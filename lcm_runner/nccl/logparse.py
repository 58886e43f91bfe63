"""Parse NCCL_DEBUG=INFO logs (one file per process, NCCL_DEBUG_FILE=<dir>/nccl.%h.%p.log).

What is read, per process: NCCL version, the network plugin chosen ("Using network IB|Socket"), IB
devices and GPUDirect RDMA lines, every communicator it joined (commId, rank, nranks, nNodes,
localRanks), the per-channel transport of every connection ("Channel 00/0 : 0[0] -> 1[1] [send] via
NET/IB/0/GDRDMA", "via P2P/CUMEM", "via SHM/direct/direct", "via NET/Socket/1"...), the algorithm and
protocol choices when printed (NCCL_DEBUG_SUBSYS=TUNING: "AllReduce: 4 Bytes -> Algo TREE proto LL
channel{Lo..Hi}={0..0}", and the older numeric "Bytes -> Algo 1 proto 2 time ..."), environment
overrides ("NCCL_X set by environment to Y") and every WARN line.
Unknown lines are ignored; nothing is guessed.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# host:pid:tid [cudaDev] NCCL INFO|WARN|TRACE message   (optionally prefixed by an mpirun "[r] " tag)
LINE = re.compile(
    r"^(?:\[\d+\]\s+)?(?P<host>[^\s:]+):(?P<pid>\d+):(?P<tid>\d+)\s+\[(?P<dev>\d+)\]\s+"
    r"NCCL\s+(?P<level>INFO|WARN|TRACE)\s?(?P<msg>.*)$"
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
        m = LINE.match(raw.rstrip())
        if not m:
            continue
        log.nccl_lines += 1
        if not log.host:
            log.host, log.pid, log.cuda_dev = m["host"], int(m["pid"]), int(m["dev"])
        msg = m["msg"].strip()
        if m["level"] == "WARN":
            log.warnings.append(msg)
            continue
        if mm := CHANNEL.match(msg):
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
            if mm["gdr"] is not None:
                log.ring_gdr = mm["gdr"] == "1"
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
    }
