"""The all-reduce probe for real on CPU: a 2-process gloo sweep on loopback (one "node"), and two
separate `lcm-runner probe --nnodes 2` processes, one per "node", meeting at a --master address.
On a machine with GPUs these run with CUDA_VISIBLE_DEVICES="" (the CPU path); one with two GPUs or
more also runs the NCCL sweep."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lcm_runner.probes import allreduce
from lcm_runner.probes.cli import main

ROOT = Path(__file__).resolve().parents[2]
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
# The children see no GPU (the CPU path) and none of the caller's probe topology.
CPU_ENV = {k: v for k, v in os.environ.items() if not k.startswith(("LCM_PROBE_", "SLURM_"))}
CPU_ENV["CUDA_VISIBLE_DEVICES"] = ""


def _expect(tmp_path: Path, cluster: float = 0.0, gpus: int = 0) -> Path:
    doc = {
        "schema": 1,
        "node": "lab-node1",
        "gpu": {"model": "h200" if gpus else "none", "count": gpus},
        "probes": {"busbw_node_gbps": 0.0, "busbw_cluster_gbps": cluster, "allreduce_max_mib": 1024},
    }
    p = tmp_path / "expect.json"
    p.write_text(json.dumps(doc))
    return p


def probe_cpu(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """`lcm-runner probe ARGV` on the CPU path: in this process where it sees no GPU, else a child."""
    if not GPUS:
        rc = main(argv)
        return rc, capsys.readouterr().out
    cmd = [sys.executable, "-m", "lcm_runner.probes", *argv]
    p = subprocess.run(cmd, cwd=ROOT, env=CPU_ENV, capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout + p.stderr


def _check_rows(rows: list[dict[str, float]], ranks: int, sizes: list[int]) -> None:
    assert [r["size_bytes"] for r in rows] == sizes
    for r in rows:
        t = r["time_us"] / 1e6
        assert r["count"] == r["size_bytes"] // 4 and t > 0
        assert r["algbw_gbps"] == pytest.approx(r["size_bytes"] / t / 1e9, rel=1e-3)
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * 2 * (ranks - 1) / ranks)


def test_one_node_cpu_sweep_is_two_gloo_processes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, md = tmp_path / "probe.json", tmp_path / "probe.md"
    argv = [
        "--expect",
        str(_expect(tmp_path)),
        "--only",
        "allreduce",
        "--json",
        str(out),
        "--markdown",
        str(md),
    ]
    rc, printed = probe_cpu(argv, capsys)
    assert rc == 0, printed
    (res,) = json.loads(out.read_text())["checks"]
    d = res["details"]
    assert (res["name"], res["scope"], res["status"], res["unit"]) == ("allreduce", "node", "pass", "GB/s")
    assert (d["backend"], d["ranks"], d["local_ranks"], d["wrong_sizes"]) == ("gloo", 2, 2, [])
    assert d["master"].startswith("127.0.0.1:")
    _check_rows(d["rows"], 2, allreduce.sweep_sizes(64 * 2**10, 8 * 2**20))
    # the figure compared: the busbw at the largest size
    assert res["value"] == pytest.approx(d["rows"][-1]["busbw_gbps"], rel=1e-5) and res["value"] > 0
    assert "busbw at 8 MiB over 2 ranks" in res["reason"]
    assert "algbw(GB/s)  busbw(GB/s)" in printed and "probe allreduce (node): PASS" in printed
    assert "| 8388608 | 2097152 |" in md.read_text()


def test_across_two_nodes_one_gloo_process_each(tmp_path: Path) -> None:
    expect = _expect(tmp_path, cluster=1e9)  # the cluster threshold applies across nodes
    port = allreduce.free_port()
    procs = []
    for rank in (0, 1):
        cmd = [sys.executable, "-m", "lcm_runner.probes", "--expect", str(expect), "--only", "allreduce"]
        cmd += ["--nnodes", "2", "--node-rank", str(rank), "--master", f"127.0.0.1:{port}", "--timeout", "30"]
        cmd += ["--allreduce-max-mib", "1", "--json", str(tmp_path / f"node{rank}.json")]
        procs.append(
            subprocess.Popen(cmd, cwd=ROOT, env=CPU_ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        )
    outs = [p.communicate(timeout=90)[0].decode() for p in procs]
    assert [p.returncode for p in procs] == [1, 1], outs  # below an impossible cluster threshold
    docs = [json.loads((tmp_path / f"node{r}.json").read_text()) for r in (0, 1)]
    for rank, doc in enumerate(docs):
        (res,) = doc["checks"]
        d = res["details"]
        assert (res["scope"], d["nnodes"], d["node_rank"], d["ranks"], d["local_ranks"]) == (
            "cluster",
            2,
            rank,
            2,
            1,
        )
        assert res["threshold"] == 1e9 and res["status"] == "fail"
        assert "< threshold 1.000e+09 GB/s" in res["reason"]
        _check_rows(d["rows"], 2, allreduce.sweep_sizes(64 * 2**10, 2**20))
        assert doc["options"]["master"] == f"127.0.0.1:{port}"
    # one collective: both nodes report the same ranks-averaged times
    assert docs[0]["checks"][0]["details"]["rows"] == docs[1]["checks"][0]["details"]["rows"]


@pytest.mark.skipif(GPUS < 2, reason="the NCCL sweep needs 2 GPUs or more on this machine")
def test_one_node_gpu_sweep_is_one_nccl_process_per_gpu(tmp_path: Path) -> None:
    out = tmp_path / "probe.json"
    argv = ["--expect", str(_expect(tmp_path, gpus=GPUS)), "--only", "allreduce", "--allreduce-max-mib", "64"]
    assert main([*argv, "--json", str(out)]) == 0
    by = {r["name"]: r for r in json.loads(out.read_text())["checks"]}
    res, d = by["allreduce"], by["allreduce"]["details"]
    assert (d["backend"], d["ranks"], d["local_ranks"], d["wrong_sizes"]) == ("nccl", GPUS, GPUS, [])
    _check_rows(d["rows"], GPUS, allreduce.sweep_sizes(2**20, 64 * 2**20))
    assert res["status"] == "pass" and res["value"] == pytest.approx(d["rows"][-1]["busbw_gbps"], rel=1e-5)


@pytest.mark.skipif(GPUS != 1, reason="needs exactly one GPU")
def test_one_gpu_is_a_skip(tmp_path: Path) -> None:
    out = tmp_path / "probe.json"
    assert main(["--expect", str(_expect(tmp_path, gpus=1)), "--only", "allreduce", "--json", str(out)]) == 0
    res = {r["name"]: r for r in json.loads(out.read_text())["checks"]}["allreduce"]
    assert (res["status"], res["value"]) == ("skip", None)
    assert res["reason"] == allreduce.ONE_RANK_REASON
