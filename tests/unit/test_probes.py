"""lcm_runner.probes: the expectation file, the threshold and neighbour checks, the peer comparison,
the busbw formula, and real runs of the GEMM and copy probes through `lcm-runner probe` (small sizes;
thresholds 0 or 1e9 so that no outcome depends on this machine's speed). On CPU here; on a GPU machine
the same tests run the GPU path (bf16, HBM) on every visible GPU."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from lcm_runner.cli import build_parser
from lcm_runner.probes import allreduce, peers
from lcm_runner.probes.cli import main
from lcm_runner.probes.expect import ExpectationError, parse_expectation
from lcm_runner.probes.result import FAIL, PASS, SKIP, ProbeResult, evaluate

SMALL = ["--gemm-n", "128", "--copy-mib", "4", "--allreduce-max-mib", "1"]
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


def expectation(**probes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schema": 1,
        "node": "lab-node1",
        "gpu": {"model": "h200" if GPUS else "none", "count": GPUS, "memory_gib": 0},
        "probes": {
            "gemm_tflops": 0.0,
            "copy_gbps": 0.0,
            "busbw_node_gbps": 0.0,
            "busbw_cluster_gbps": 0.0,
            "peer_ratio": 0.8,
            "gemm_n": 8192,
            "copy_mib": 4096,
            "allreduce_max_mib": 1024,
        },
    }
    doc["probes"].update(probes)
    return doc


def write_expect(tmp_path: Path, doc: Any, name: str = "expect.json") -> Path:
    p = tmp_path / name
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc), encoding="utf-8")
    return p


# ----------------------------------------------------------------------------- formulas and checks


def test_busbw_formula_against_a_hand_computed_case() -> None:
    # 1 GiB in 4 ms over 8 ranks: algbw = 2^30 / 0.004 / 1e9 = 268.435456 GB/s,
    # busbw = algbw x 2 x 7 / 8 = 469.762048 GB/s
    assert allreduce.algbw_gbps(2**30, 0.004) == pytest.approx(268.435456)
    assert allreduce.busbw_gbps(2**30, 0.004, 8) == pytest.approx(469.762048)
    assert allreduce.busbw_factor(2) == 1.0
    (row,) = allreduce.rows_from_times([2**30], [0.004], 8)
    assert (row.count, row.time_us) == (2**28, 4000.0)
    assert row.busbw_gbps == pytest.approx(469.762048)


def test_sweep_sizes_double_from_the_first_to_the_largest() -> None:
    assert allreduce.sweep_sizes(2**20, 2**23) == [2**20, 2**21, 2**22, 2**23]
    cfg = allreduce.plan(8, 1, 0, None, 1024, 60.0)
    assert isinstance(cfg, allreduce.SweepConfig)
    assert (cfg.backend, cfg.local_world, cfg.sizes[0], cfg.sizes[-1]) == ("nccl", 8, 2**20, 2**30)
    assert (cfg.master_addr, cfg.world) == ("127.0.0.1", 8)
    cpu = allreduce.plan(0, 1, 0, None, None, 60.0)
    assert isinstance(cpu, allreduce.SweepConfig)
    assert (cpu.backend, cpu.local_world, cpu.sizes[0], cpu.sizes[-1]) == ("gloo", 2, 64 * 2**10, 8 * 2**20)
    across = allreduce.plan(8, 4, 3, ("10.0.0.1", 29512), 1024, 60.0)
    assert isinstance(across, allreduce.SweepConfig)
    assert (across.world, across.node_rank, across.master_port) == (32, 3, 29512)


def test_one_gpu_on_one_node_is_a_skip_with_the_reason_not_a_number() -> None:
    res = allreduce.run(gpus=1, nnodes=1, node_rank=0, master=None, max_mib=1024, threshold=300.0)
    assert (res.status, res.value) == (SKIP, None)
    assert res.reason == "1 GPU on this node: an all-reduce needs at least 2 ranks; no figure"
    # one GPU per node across nodes is a real all-reduce (2 ranks), not a skip
    assert isinstance(allreduce.plan(1, 2, 0, ("10.0.0.1", 29512), 1024, 60.0), allreduce.SweepConfig)


def test_threshold_compares_the_slowest_gpu() -> None:
    res = evaluate("gemm", "TFLOP/s", [700.0, 640.0, 705.0], 650.0, 0.8)
    assert res.status == FAIL and res.value == 640.0 and res.per_gpu == [700.0, 640.0, 705.0]
    assert "GPU 1: 640 TFLOP/s < threshold 650 TFLOP/s" in res.reason
    ok = evaluate("gemm", "TFLOP/s", [700.0, 690.0], 650.0, 0.8)
    assert ok.status == PASS and ok.value == 690.0 and "690 TFLOP/s >= threshold 650" in ok.reason


def test_a_gpu_at_half_its_neighbours_fails_above_the_threshold() -> None:
    res = evaluate("copy", "GB/s", [3900.0, 3950.0, 1900.0, 3920.0], 1000.0, 0.8)
    assert res.status == FAIL
    assert "GPU 2: 1900 GB/s < 0.8 x 3920 GB/s (the median of this node's other GPUs)" in res.reason
    assert "GPU 0" not in res.reason and "threshold" not in res.reason


def test_a_gpu_without_a_figure_fails() -> None:
    res = evaluate("gemm", "TFLOP/s", [700.0, None], 0.0, 0.8, errors=[None, "OutOfMemoryError: CUDA"])
    assert res.status == FAIL and res.value == 700.0
    assert "GPU 1: no figure (OutOfMemoryError: CUDA)" in res.reason


# ----------------------------------------------------------------------------- the expectation file


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ("{not json", "not JSON: Expecting property name"),
        ([1, 2], "must be a JSON object, got list"),
        ({**expectation(), "schema": 2}, "schema: must be 1, got 2"),
        ({**expectation(), "node": "../etc"}, "node: must be a host name"),
        ({**expectation(), "gpu": {"model": "h200"}}, "gpu.count: must be a whole number >= 0, got None"),
        ({**expectation(), "probes": [650]}, "probes: must be an object of thresholds"),
        (expectation(gemm_tflops="fast"), "probes.gemm_tflops: must be a number, got 'fast'"),
        (expectation(copy_gbps=-1), "probes.copy_gbps: must be >= 0, got -1"),
        (expectation(peer_ratio=1.5), "probes.peer_ratio: must be in (0, 1], got 1.5"),
        (expectation(allreduce_max_mib=1000), "probes.allreduce_max_mib: must be a power of two"),
        (expectation(gemm_n=0), "probes.gemm_n: must be a whole number >= 1, got 0"),
    ],
)
def test_bad_expectation_exits_2_with_what_is_wrong(
    doc: Any, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_expect(tmp_path, doc)
    assert main(["--expect", str(path), "--json", str(tmp_path / "out.json")]) == 2
    err = capsys.readouterr().err
    assert message in err and str(path) in err
    assert not (tmp_path / "out.json").exists()


def test_missing_threshold_of_a_selected_probe_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = expectation()
    del doc["probes"]["gemm_tflops"]
    path = write_expect(tmp_path, doc)
    assert main(["--expect", str(path), "--only", "gemm"]) == 2
    assert "probes.gemm_tflops: missing (needed by --only gemm" in capsys.readouterr().err
    # not needed when gemm is not run; the unknown key is ignored
    doc["probes"]["future_key"] = 1
    path = write_expect(tmp_path, doc)
    assert main(["--expect", str(path), "--only", "copy", *SMALL]) == 0


def test_the_expectation_keeps_the_contract_fields() -> None:
    exp = parse_expectation(expectation(gemm_tflops=650.0), "x.json")
    assert (exp.node, exp.gpu_model, exp.gpu_count, exp.peer_ratio) == (
        "lab-node1",
        "h200" if GPUS else "none",
        GPUS,
        0.8,
    )
    assert exp.thresholds["gemm_tflops"] == 650.0 and (exp.gemm_n, exp.copy_mib) == (8192, 4096)
    with pytest.raises(ExpectationError, match=r"x\.json: node"):
        parse_expectation({**expectation(), "node": ""}, "x.json")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--only", "gemm,bogus"], "--only bogus: not one of gemm,copy,allreduce"),
        (["--nnodes", "2", "--node-rank", "0"], "--nnodes 2: needs --master ADDR:PORT"),
        (["--nnodes", "2", "--node-rank", "2", "--master", "h:1"], "--node-rank 2: must be within 0..1"),
        (["--nnodes", "2", "--node-rank", "0", "--master", "host"], "--master 'host': must be ADDR:PORT"),
        (["--nnodes", "two"], "--nnodes: not a whole number: 'two'"),
        (["--allreduce-max-mib", "3"], "--allreduce-max-mib 3: must be a power of two"),
        (["--peers", "/nonexistent/peers"], "--peers /nonexistent/peers: not a directory"),
    ],
)
def test_bad_arguments_exit_2(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_expect(tmp_path, expectation())
    assert main(["--expect", str(path), *argv]) == 2
    assert message in capsys.readouterr().err


def test_missing_expectation_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--expect", str(tmp_path / "nope.json")]) == 2
    assert "nope.json: cannot read the expectation file" in capsys.readouterr().err


# ----------------------------------------------------------------------------- real runs


def test_registered_as_lcm_runner_probe() -> None:
    ap = build_parser()
    choices = next(a for a in ap._actions if a.dest == "command").choices
    assert "probe" in choices and "unavailable" not in choices["probe"].get_default("func").__name__


def test_gemm_and_copy_pass_a_zero_threshold_with_json_and_markdown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_expect(tmp_path, expectation())
    out, md = tmp_path / "r" / "probe.json", tmp_path / "probe.md"
    rc = main(
        ["--expect", str(path), "--only", "gemm,copy", "--json", str(out), "--markdown", str(md), *SMALL]
    )
    assert rc == 0, capsys.readouterr()
    doc = json.loads(out.read_text())
    assert doc["schema"] == 1 and doc["node"] == "lab-node1" and doc["status"] == "pass"
    env = doc["environment"]
    assert env["torch"] == torch.__version__ and "nccl" in env and "cuda" in env
    assert env["device_type"] == ("cuda" if GPUS else "cpu")
    assert [d["label"] for d in env["devices"]] == ([f"GPU {i}" for i in range(GPUS)] if GPUS else ["cpu"])
    by = {r["name"]: r for r in doc["checks"]}
    # the devices check only where GPUs are expected (the CPU lab's expectation counts 0)
    assert set(by) == {"gemm", "copy"} | ({"devices"} if GPUS else set())
    gemm, copy = by["gemm"], by["copy"]
    assert gemm["unit"] == "TFLOP/s" and gemm["value"] > 0 and gemm["status"] == "pass"
    assert len(gemm["details"]["measurements"]) == max(GPUS, 1)
    for m in gemm["details"]["measurements"]:
        assert (m["n"], m["dtype"]) == (128, "bfloat16" if GPUS else "float32")
        assert m["tflops"] == pytest.approx(2 * 128**3 / m["seconds_per_product"] / 1e12)
    assert gemm["value"] == pytest.approx(min(m["tflops"] for m in gemm["details"]["measurements"]), rel=1e-5)
    assert copy["unit"] == "GB/s" and copy["value"] > 0
    for c in copy["details"]["measurements"]:
        assert c["bytes"] == 4 * 2**20
        assert c["gbps"] == pytest.approx(2 * c["bytes"] / c["seconds_per_copy"] / 1e9)
    assert (gemm["per_gpu"] is None) == (GPUS < 2)
    assert gemm["threshold"] == 0.0 and "no floor" in gemm["reason"]
    assert doc["options"]["gemm_n"] == 128 and doc["expectation"]["thresholds"]["gemm_tflops"] == 0.0
    text = md.read_text()
    assert "| check | scope | status | value | threshold | unit | per GPU | reason |" in text
    assert "| gemm | node | PASS |" in text and "| copy | node | PASS |" in text
    assert "verdict: PASS" in capsys.readouterr().out


def test_impossible_threshold_fails_naming_value_and_threshold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_expect(tmp_path, expectation(gemm_tflops=1e9, copy_gbps=1e9))
    out = tmp_path / "probe.json"
    assert main(["--expect", str(path), "--only", "gemm,copy", "--json", str(out), *SMALL]) == 1
    doc = json.loads(out.read_text())
    assert doc["status"] == "fail" and doc["failed"] == ["gemm", "copy"]
    for r in doc["checks"]:
        assert r["status"] == ("pass" if r["name"] == "devices" else "fail")
        if r["name"] == "devices":
            continue
        m = re.fullmatch(
            rf"(GPU \d+|cpu): ([0-9.e+-]+) {r['unit']} < threshold 1\.000e\+09 {r['unit']}", r["reason"]
        )
        assert m, r["reason"]
        assert float(m.group(2)) == pytest.approx(r["value"], rel=1e-3)
        assert m.group(1).startswith("GPU " if GPUS else "cpu")  # the slowest device is named
    printed = capsys.readouterr().out
    assert "probe gemm: FAIL: " in printed and "verdict: FAIL (gemm, copy failed)" in printed


def test_expected_gpus_missing_fail_the_devices_check(tmp_path: Path) -> None:
    doc = expectation()
    doc["gpu"] = {"model": "h200", "count": GPUS + 8}
    path = write_expect(tmp_path, doc)
    out = tmp_path / "probe.json"
    assert main(["--expect", str(path), "--only", "gemm", "--json", str(out), *SMALL]) == 1
    dev = json.loads(out.read_text())["checks"][0]
    assert dev["name"] == "devices" and dev["status"] == "fail"
    assert dev["reason"] == f"expected {GPUS + 8} GPUs (h200), this process sees {GPUS}"


# ----------------------------------------------------------------------------- peers


def peer_doc(node: str, gemm: float, copy: float | None = None) -> dict[str, Any]:
    results = [{"name": "gemm", "scope": "node", "status": "pass", "value": gemm}]
    if copy is not None:
        results.append({"name": "copy", "scope": "node", "status": "skip", "value": copy})
    return {"schema": 1, "kind": "lcm-probe", "node": node, "checks": results}


def test_peer_comparison_unit() -> None:
    p = peers.Peers("/shared/probes", {("gemm", "node"): {"n2": 700.0, "n3": 680.0, "n4": 690.0}})
    slow = ProbeResult("gemm", PASS, 340.0, 0.0, "TFLOP/s", "ok")
    fast = ProbeResult("gemm", PASS, 650.0, 0.0, "TFLOP/s", "ok")
    nobody = ProbeResult("copy", PASS, 1.0, 0.0, "GB/s", "ok")
    peers.compare([slow, fast, nobody], p, 0.8)
    assert slow.status == FAIL and fast.status == PASS and nobody.status == PASS
    assert slow.reason == "340 TFLOP/s < 0.8 x 690 TFLOP/s (the median of 3 other node(s) in /shared/probes)"
    assert fast.details["peers"]["median"] == 690.0 and nobody.details["peers"]["nodes"] == 0


def test_peers_dir_fails_a_node_at_half_its_neighbours_and_records_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shared = tmp_path / "peers"
    shared.mkdir()
    for node in ("lab-node2", "lab-node3"):
        (shared / f"{node}.json").write_text(json.dumps(peer_doc(node, 1e9, copy=1e9)))
    (shared / "broken.json").write_text("{")
    (shared / "lab-node1.json").write_text(json.dumps(peer_doc("lab-node1", 1e12)))  # our old one: not a peer
    path = write_expect(tmp_path, expectation())
    assert main(["--expect", str(path), "--only", "gemm,copy", "--peers", str(shared), *SMALL]) == 1
    own = json.loads((shared / "lab-node1.json").read_text())
    by = {r["name"]: r for r in own["checks"]}
    assert by["gemm"]["status"] == "fail"
    assert f"< 0.8 x 1.000e+09 TFLOP/s (the median of 2 other node(s) in {shared})" in by["gemm"]["reason"]
    assert by["copy"]["status"] == "pass"  # the peers' copy figures were skips: nothing to compare
    assert own["peers"]["nodes"] == ["lab-node2", "lab-node3"]
    assert own["peers"]["ignored"] and own["peers"]["ignored"][0].startswith("broken.json: JSONDecodeError")
    assert not list(shared.glob(".*.tmp"))
    assert f"wrote {shared / 'lab-node1.json'}" in capsys.readouterr().out


def test_peers_dir_passes_among_equals(tmp_path: Path) -> None:
    shared = tmp_path / "peers"
    shared.mkdir()
    (shared / "lab-node2.json").write_text(json.dumps(peer_doc("lab-node2", 1e-9)))
    path = write_expect(tmp_path, expectation())
    out = tmp_path / "probe.json"
    assert (
        main(["--expect", str(path), "--only", "gemm", "--peers", str(shared), "--json", str(out), *SMALL])
        == 0
    )
    gemm = {r["name"]: r for r in json.loads(out.read_text())["checks"]}["gemm"]
    assert gemm["status"] == "pass" and gemm["details"]["peers"]["figures"] == {"lab-node2": 1e-9}
    assert (
        json.loads((shared / "lab-node1.json").read_text())["checks"] == json.loads(out.read_text())["checks"]
    )
