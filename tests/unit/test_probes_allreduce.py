"""The all-reduce probe for real on CPU: a 2-process gloo sweep on loopback (one "node"), and two
separate `lcm-runner probe --nnodes 2` processes, one per "node", meeting at a --master address."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lcm_runner.probes import allreduce
from lcm_runner.probes.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _expect(tmp_path: Path, cluster: float = 0.0) -> Path:
    doc = {
        "schema": 1,
        "node": "lab-node1",
        "gpu": {"model": "none", "count": 0},
        "probes": {"busbw_node_gbps": 0.0, "busbw_cluster_gbps": cluster, "allreduce_max_mib": 1024},
    }
    p = tmp_path / "expect.json"
    p.write_text(json.dumps(doc))
    return p


def _check_rows(rows: list[dict[str, float]], ranks: int, sizes: list[int]) -> None:
    assert [r["size_bytes"] for r in rows] == sizes
    for r in rows:
        t = r["time_us"] / 1e6
        assert r["count"] == r["size_bytes"] // 4 and t > 0
        assert r["algbw_gbps"] == pytest.approx(r["size_bytes"] / t / 1e9, rel=1e-3)
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * 2 * (ranks - 1) / ranks)


def test_one_node_cpu_sweep_is_two_gloo_processes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, md = tmp_path / "probe.json", tmp_path / "probe.md"
    rc = main(
        ["--expect", str(_expect(tmp_path)), "--only", "allreduce", "--json", str(out), "--markdown", str(md)]
    )
    assert rc == 0
    (res,) = json.loads(out.read_text())["results"]
    d = res["details"]
    assert (res["name"], res["scope"], res["status"], res["unit"]) == ("allreduce", "node", "pass", "GB/s")
    assert (d["backend"], d["ranks"], d["local_ranks"], d["wrong_sizes"]) == ("gloo", 2, 2, [])
    assert d["master"].startswith("127.0.0.1:")
    _check_rows(d["rows"], 2, allreduce.sweep_sizes(64 * 2**10, 8 * 2**20))
    assert res["value"] == d["rows"][-1]["busbw_gbps"] > 0  # the figure compared: busbw at the largest size
    assert "busbw at 8 MiB over 2 ranks" in res["reason"]
    printed = capsys.readouterr().out
    assert "algbw(GB/s)  busbw(GB/s)" in printed and "probe allreduce (node): PASS" in printed
    assert "| 8388608 | 2097152 |" in md.read_text()


def test_across_two_nodes_one_gloo_process_each(tmp_path: Path) -> None:
    expect = _expect(tmp_path, cluster=1e9)  # the cluster threshold applies across nodes
    port = allreduce.free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LCM_PROBE_", "SLURM_"))}
    procs = []
    for rank in (0, 1):
        cmd = [sys.executable, "-m", "lcm_runner.probes", "--expect", str(expect), "--only", "allreduce"]
        cmd += ["--nnodes", "2", "--node-rank", str(rank), "--master", f"127.0.0.1:{port}", "--timeout", "30"]
        cmd += ["--allreduce-max-mib", "1", "--json", str(tmp_path / f"node{rank}.json")]
        procs.append(
            subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        )
    outs = [p.communicate(timeout=60)[0].decode() for p in procs]
    assert [p.returncode for p in procs] == [1, 1], outs  # below an impossible cluster threshold
    docs = [json.loads((tmp_path / f"node{r}.json").read_text()) for r in (0, 1)]
    for rank, doc in enumerate(docs):
        (res,) = doc["results"]
        d = res["details"]
        assert (res["scope"], d["nnodes"], d["node_rank"], d["ranks"], d["local_ranks"]) == (
            "cluster",
            2,
            rank,
            2,
            1,
        )
        assert (
            res["threshold"] == 1e9
            and res["status"] == "fail"
            and "< threshold 1.000e+09 GB/s" in res["reason"]
        )
        _check_rows(d["rows"], 2, allreduce.sweep_sizes(64 * 2**10, 2**20))
        assert doc["options"]["master"] == f"127.0.0.1:{port}"
    # one collective: both nodes report the same ranks-averaged times
    assert docs[0]["results"][0]["details"]["rows"] == docs[1]["results"][0]["details"]["rows"]
