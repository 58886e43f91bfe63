"""The line patterns of NCCL_DEBUG=INFO logs (and of torch's ProcessGroupNCCL lines) that logparse.py reads;
kept apart from the parser so the patterns, with the sources they were taken from, read as one list."""

from __future__ import annotations

import re

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
