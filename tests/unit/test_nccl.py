"""lcm_runner.nccl: real NCCL logs (the H200 pair in fixtures/nccl) and synthesized 2-node logs.

The synthesized lines follow NCCL's own formats (as printed by NCCL 2.x, e.g. NVIDIA/nccl issues 707,
1232, 952 and enqueue.cc's TUNING line), so that each flag is proven to fire on the input it is about.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lcm_runner import config
from lcm_runner.nccl import Expect, check, parse_file, parse_text, profile_dir
from lcm_runner.nccl.logparse import transport_kind

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures" / "nccl"
IB_SPEC = config.load_cluster(ROOT / "inventories" / "example-h200")
LAB_SPEC = config.load_cluster(ROOT / "inventories" / "lab")


def test_fixture_rank0_parsed() -> None:
    log = parse_file(FIXTURES / "h200x2-nvlink-p2p.rank0.log")
    assert (log.host, log.pid, log.cuda_dev) == ("vm", 1329, 0)
    assert log.nccl_version == "2.28.9+cuda13.0"
    assert log.net_plugin == "Socket" and log.net_plugins_initialized == ["Socket"]
    assert log.env == {"NCCL_NVLS_ENABLE": "0"}
    assert len(log.comms) == 8 and log.rank == 0 and log.world_comm.nranks == 2
    assert {ch.kind for ch in log.channels} == {"P2P/CUMEM"}
    assert len(log.channels) == 128 and log.ring_gdr is True
    assert all(ch.src == 0 and ch.dst == 1 for ch in log.channels)
    assert log.warnings == []


def test_fixture_pair_profile_no_spec_and_ib_spec() -> None:
    plain = profile_dir(FIXTURES)
    assert plain["files"] == 2 and plain["ok"] and plain["flags"] == []
    assert [r["rank"] for r in plain["ranks"]] == [0, 1]
    assert plain["ranks"][1]["transports"] == {"P2P/CUMEM": 160}
    assert plain["ranks"][0]["intra_node"] == ["P2P/CUMEM"] and plain["ranks"][0]["inter_node"] == []
    # Against the production spec (IB + NVSwitch): the Socket plugin is reported (single node: a warning)
    s = profile_dir(FIXTURES, IB_SPEC)
    codes = {(f["code"], f["severity"]) for f in s["flags"]}
    assert ("net_plugin_not_ib", "warn") in codes
    assert ("p2p_link_unverified", "info") in codes
    assert not any(f["code"] in ("socket_between_nodes", "non_nvlink_intra_node") for f in s["flags"])
    assert s["ok"]


@pytest.mark.parametrize(
    ("via", "kind"),
    [
        ("P2P/CUMEM", "P2P/CUMEM"),
        ("P2P/IPC/read", "P2P/IPC"),
        ("P2P/direct", "P2P/direct"),
        ("SHM/direct/direct", "SHM"),
        ("NET/IB/0/GDRDMA", "NET/IB/GDRDMA"),
        ("NET/IB/5", "NET/IB"),
        ("NET/IBext_v8/3", "NET/IB"),
        ("NET/Socket/0", "NET/Socket"),
    ],
)
def test_transport_kinds(via: str, kind: str) -> None:
    assert transport_kind(via) == kind


def _node_log(
    host: str, pid: int, rank: int, dev: int, net: str, channels: list[str], extra: str = ""
) -> str:
    """One process of a 2-node x 2-GPU job, in NCCL's log format."""
    p = f"{host}:{pid}:{pid} [{dev}] NCCL INFO "
    lines = [
        "NCCL version 2.21.5+cuda12.4",
        f"Using network {net}",
        f"ncclCommInitRank comm 0x55d0{rank} rank {rank} nranks 4 cudaDev {dev} nvmlDev {dev} busId 1b000 "
        "commId 0xabc123 - Init START",
        f"comm 0x55d0{rank} rank {rank} nRanks 4 nNodes 2 localRanks 2 localRank {dev} MNNVL 0",
        *channels,
        "Connected all rings, use ring PXN 0 GDR 1",
        f"ncclCommInitRank comm 0x55d0{rank} rank {rank} nranks 4 cudaDev {dev} nvmlDev {dev} busId 1b000 "
        "commId 0xabc123 - Init COMPLETE",
    ]
    text = "".join(p + ln + "\n" for ln in lines)
    return text + extra


def _two_node_dir(tmp_path: Path, inter: str, intra: str = "P2P/CUMEM", warn: bool = False) -> Path:
    d = tmp_path / "nccl"
    d.mkdir()
    layout = [("nodeA", 100, 0, 0), ("nodeA", 101, 1, 1), ("nodeB", 200, 2, 0), ("nodeB", 201, 3, 1)]
    net = "IB" if inter.startswith("NET/IB") else "Socket"
    for host, pid, rank, dev in layout:
        peer_local = rank ^ 1
        peer_remote = (rank + 2) % 4
        chans = [
            f"Channel 00/0 : {rank}[{dev}] -> {peer_local}[{peer_local % 2}] via {intra}",
            f"Channel 00/0 : {rank}[{dev}] -> {peer_remote}[{dev}] [send] via {inter}",
            f"Channel 01/0 : {peer_remote}[{dev}] -> {rank}[{dev}] [receive] via {inter}",
        ]
        extra = ""
        if warn and rank == 3:
            extra = (
                f"{host}:{pid}:{pid + 7} [{dev}] NCCL WARN NET/IB : Got completion from peer with status=12\n"
            )
        if rank == 0:
            extra += (
                f"{host}:{pid}:{pid} [{dev}] NCCL INFO AllReduce: 1048576 Bytes -> Algo RING proto SIMPLE "
                "channel{Lo..Hi}={0..7}\n"
            )
            extra += (
                f"{host}:{pid}:{pid} [{dev}] NCCL INFO 805306368 Bytes -> Algo 0 proto 2 time 3970.683594\n"
            )
        (d / f"nccl.{host}.{pid}.log").write_text(_node_log(host, pid, rank, dev, net, chans, extra))
    return d


def test_ib_gdrdma_two_nodes_is_clean(tmp_path: Path) -> None:
    s = profile_dir(_two_node_dir(tmp_path, "NET/IB/0/GDRDMA"), IB_SPEC)
    assert s["ok"], s["flags"]
    assert [f["code"] for f in s["flags"]] == ["p2p_link_unverified"] * 4
    r0 = s["ranks"][0]
    assert r0["inter_node"] == ["NET/IB/GDRDMA"] and r0["intra_node"] == ["P2P/CUMEM"]
    assert r0["nnodes"] == 2 and r0["net_plugin"] == "IB"
    assert r0["algos"] == {"AllReduce": {"RING/SIMPLE": 1}, "?": {"TREE/SIMPLE": 1}}
    assert s["algos"] == ["?:TREE/SIMPLE", "AllReduce:RING/SIMPLE"]


def test_socket_between_nodes_where_spec_says_ib(tmp_path: Path) -> None:
    s = profile_dir(_two_node_dir(tmp_path, "NET/Socket/0"), IB_SPEC)
    assert not s["ok"]
    sock = [f for f in s["flags"] if f["code"] == "socket_between_nodes"]
    assert len(sock) == 4 and all(f["severity"] == "error" for f in sock)
    plugin = [f for f in s["flags"] if f["code"] == "net_plugin_not_ib"]
    assert plugin and plugin[0]["severity"] == "error"  # multi-node communicators: an error, not a warning
    # the same logs on an ethernet cluster are what is expected
    assert profile_dir(tmp_path / "nccl", LAB_SPEC)["ok"]


def test_ib_without_gdr_is_info(tmp_path: Path) -> None:
    s = profile_dir(_two_node_dir(tmp_path, "NET/IB/0"), IB_SPEC)
    assert s["ok"] and {f["code"] for f in s["flags"]} >= {"no_gdrdma"}


def test_shm_inside_node_where_spec_says_nvlink(tmp_path: Path) -> None:
    s = profile_dir(_two_node_dir(tmp_path, "NET/IB/0/GDRDMA", intra="SHM/direct/direct"), IB_SPEC)
    bad = [f for f in s["flags"] if f["code"] == "non_nvlink_intra_node"]
    assert len(bad) == 4 and not s["ok"]
    assert "SHM" in bad[0]["detail"]


def test_ranks_that_disagree_and_warnings(tmp_path: Path) -> None:
    d = _two_node_dir(tmp_path, "NET/IB/0/GDRDMA", warn=True)
    f = d / "nccl.nodeB.201.log"  # rank 3 reached its peers over TCP
    f.write_text(
        f.read_text()
        .replace("NET/IB/0/GDRDMA", "NET/Socket/1")
        .replace("Using network IB", "Using network Socket")
    )
    s = profile_dir(d, IB_SPEC)
    dis = [x for x in s["flags"] if x["code"] == "ranks_disagree"]
    aspects = {x["detail"].split(" differs")[0] for x in dis}
    assert aspects == {"network plugin", "inter-node transports"}
    assert any("Socket: ranks 3" in x["detail"] for x in dis)
    assert any(x["code"] == "nccl_warnings" and x["ranks"] == [3] for x in s["flags"])
    assert s["warnings"] == 1


def test_no_logs(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    s = profile_dir(tmp_path / "empty")
    assert not s["ok"] and s["flags"][0]["code"] == "no_logs"
    with pytest.raises(FileNotFoundError):
        profile_dir(tmp_path / "missing")


def test_mpirun_prefixed_and_garbage_lines() -> None:
    text = (
        "[1] node2:22555:22555 [0] NCCL INFO Channel 00/0 : 2[1] -> 1[0] [receive] via NET/Socket/0\n"
        "random stdout line\n"
        "node2:22555:22555 [0] NCCL INFO Channel 00 : 2[1] -> 0[0] via SHM/direct/direct\n"
    )
    log = parse_text(text)
    assert [c.kind for c in log.channels] == ["NET/Socket", "SHM"] and log.host == "node2"
    assert log.lines == 3 and log.nccl_lines == 2
    flags = check([log], Expect("IB", True))
    assert {f.code for f in flags} == {"socket_between_nodes", "non_nvlink_intra_node"}


def test_cli_parse_only(tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "lcm_runner.nccl",
            str(FIXTURES),
            "-i",
            str(ROOT / "inventories" / "example-h200"),
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert "rank 0 (vm:1329 dev 0): NCCL 2.28.9+cuda13.0, net Socket" in r.stdout
    assert "[WARN] net_plugin_not_ib" in r.stdout and "verdict: PASS" in r.stdout
    assert json.loads(out.read_text())["files"] == 2
    shutil.copytree(FIXTURES, tmp_path / "copy")
    bad = _two_node_dir(tmp_path, "NET/Socket/0")
    r = subprocess.run(
        [sys.executable, "-m", "lcm_runner.nccl", str(bad), "-i", str(ROOT / "inventories" / "example-h200")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert r.returncode == 1 and "verdict: FAIL" in r.stdout


# --- logs captured on the lent 2x H200 machine with the rendered nccl_env.sh (see fixtures/nccl/README.md)


def test_h200_tuning_logs_give_algorithms_and_prove_nvlink() -> None:
    s = profile_dir(FIXTURES / "h200x2-tuning", IB_SPEC)
    r0, r1 = s["ranks"]
    assert r0["algos"]["AllReduce"] == {"RING/LL": 14, "RING/SIMPLE": 14}
    assert set(r0["algos"]) == {"AllGather", "AllReduce", "Broadcast", "ReduceScatter"}
    assert r1["algos"] == {}  # NCCL prints the choice on rank 0 only
    assert r0["env"]["NCCL_P2P_LEVEL"] == "NVL" and r0["intra_node"] == ["P2P/CUMEM"]
    codes = {f["code"] for f in s["flags"]}
    assert "p2p_link_unverified" not in codes  # NCCL_P2P_LEVEL=NVL and NVL links in the topology dump
    assert "non_nvlink_intra_node" not in codes and s["ok"]


def test_h200_shm_logs_flag_non_nvlink_path() -> None:
    s = profile_dir(FIXTURES / "h200x2-shm", IB_SPEC)
    assert s["transports"] == ["SHM"] and not s["ok"]
    assert [f["ranks"] for f in s["flags"] if f["code"] == "non_nvlink_intra_node"] == [[0], [1]]
    # without an NVLink expectation (the lab spec) the same logs are fine
    assert profile_dir(FIXTURES / "h200x2-shm", LAB_SPEC)["ok"]


def test_h200_socket_logs_are_intra_node_even_though_nccl_says_two_nodes() -> None:
    logs = [parse_file(p) for p in sorted((FIXTURES / "h200x2-socket").glob("*.log"))]
    assert all(c.nnodes == 2 and c.local_ranks == 1 for log in logs for c in log.comms.values())
    s = profile_dir(FIXTURES / "h200x2-socket", IB_SPEC)
    r0 = s["ranks"][0]
    assert r0["intra_node"] == ["NET/Socket"] and r0["inter_node"] == []  # one host: not "between nodes"
    codes = {f["code"] for f in s["flags"]}
    assert "socket_between_nodes" not in codes and "non_nvlink_intra_node" in codes
    assert r0["gdr"] is False
