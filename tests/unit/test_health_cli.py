"""`lcm-runner health check` end to end on captured outputs (--from-dir), plus collect's missing tools."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from lcm_runner.cli import main
from lcm_runner.health import cli as health_cli
from lcm_runner.health.collect import Output, collect
from lcm_runner.health.evaluate import evaluate
from lcm_runner.health.expect import ExpectError, from_dict, load
from lcm_runner.health.report import DRAIN_MAX, Check, Report

FIX = Path(__file__).parent / "fixtures" / "health"
CONTRACT = {
    "schema": 1,
    "node": "lab-node1",
    "gpu": {"model": "h200", "count": 1, "driver": "580.159.04", "persistence": True, "ecc": True,
            "pcie_gen": 0, "pcie_width": 0, "nvlink": False, "nvswitch": False, "fabric_manager": False,
            "xid_ignore": []},
    "fabric": {"type": "ethernet", "hcas": [], "rate_gbps": 0, "port": 1},
    "probes": {"gemm_tflops": 650.0, "copy_gbps": 3500.0, "busbw_node_gbps": 300.0, "busbw_cluster_gbps": 0.0,
               "peer_ratio": 0.8, "gemm_n": 8192, "copy_mib": 4096, "allreduce_max_mib": 1024},
}  # fmt: skip


def _expect(tmp_path: Path, **over: object) -> Path:
    data = json.loads(json.dumps(CONTRACT))
    for key, value in over.items():
        section, _, field = key.partition("__")
        data[section][field] = value
    p = tmp_path / "node-health.json"
    p.write_text(json.dumps(data))
    return p


def _capture(tmp_path: Path, xml: str | None = None, dmesg: str | None = None) -> Path:
    d = tmp_path / "capture"
    shutil.copytree(FIX / "h200-1gpu", d)
    if xml:
        shutil.copy(FIX / "derived" / xml, d / "nvidia-smi-q.xml")
    if dmesg:
        shutil.copy(FIX / "derived" / dmesg, d / "dmesg.txt")
    return d


def test_contract_loads_every_field() -> None:
    exp = from_dict(CONTRACT)
    assert exp.node == "lab-node1" and exp.gpu.driver == "580.159.04" and exp.probes.peer_ratio == 0.8
    assert exp.probes.allreduce_max_mib == 1024 and isinstance(exp.probes.gemm_tflops, float)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"schema": 2}, "schema"),
        ({"node": ""}, "node"),
        ({"gpu": {"model": "a100", "count": 1}}, "gpu.model"),
        ({"gpu": {"model": "none", "count": 8}}, "0 exactly when"),
        ({"gpu": {"model": "h200", "count": "8"}}, "gpu.count"),
        ({"fabric": {"type": "infiniband", "hcas": "mlx5_0"}}, "fabric.hcas"),
    ],
)
def test_bad_contract(change: dict[str, object], message: str) -> None:
    with pytest.raises(ExpectError, match=message):
        from_dict({**CONTRACT, **change})


def test_real_capture_is_healthy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_json, out_md = tmp_path / "r" / "last.json", tmp_path / "r" / "last.md"
    rc = main(["health", "check", "--expect", str(_expect(tmp_path)), "--from-dir", str(FIX / "h200-1gpu"),
               "--json", str(out_json), "--markdown", str(out_md)])  # fmt: skip
    assert rc == 0, capsys.readouterr().out
    report = json.loads(out_json.read_text())
    assert report["healthy"] is True and report["failed"] == []
    assert {c["name"] for c in report["checks"]} >= {
        "gpu.ecc",
        "gpu.xid",
        "gpu.pcie_gen",
        "fabric.hcas_present",
    }
    md = out_md.read_text()
    assert "| `gpu.driver` | pass | 580.159.04 | 580.159.04 |  |" in md
    assert "lab-node1: HEALTHY" in capsys.readouterr().out


def test_unhealthy_capture_exits_1_and_drains(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "scontrol.args"
    (bindir / "scontrol").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {log}\n')
    (bindir / "scontrol").chmod(0o755)
    cap = _capture(tmp_path, xml="nvidia-smi-q.remap-pending.xml", dmesg="dmesg.xid79.txt")
    old = os.environ["PATH"]
    os.environ["PATH"] = f"{bindir}:{old}"
    try:
        rc = main(["health", "check", "--expect", str(_expect(tmp_path)), "--from-dir", str(cap), "--drain"])
    finally:
        os.environ["PATH"] = old
    out = capsys.readouterr()
    assert rc == 1
    assert "FAIL gpu.row_remap_pending: gpu0 (00000000:00:06.0): Yes" in out.out
    assert "FAIL gpu.xid: Xid 79 on PCI:0000:00:06" in out.out
    assert log.read_text().splitlines() == [
        "update",
        "NodeName=lab-node1",
        "State=DRAIN",
        "Reason=lcm-health: gpu.row_remap_pending,gpu.xid",
    ]


def test_bad_input_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["health", "check", "--expect", str(tmp_path / "missing.json")]) == 2
    (tmp_path / "bad.json").write_text("{")
    assert main(["health", "check", "--expect", str(tmp_path / "bad.json")]) == 2
    assert "not JSON" in capsys.readouterr().err


def test_restricted_kernel_log_is_reported_not_passed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cap = _capture(tmp_path, dmesg="dmesg.restricted.txt")
    assert main(["health", "check", "--expect", str(_expect(tmp_path)), "--from-dir", str(cap)]) == 0
    assert (
        "SKIP gpu.xid: - (expected no XID) (kernel log unreadable: dmesg: "
        "dmesg: read kernel buffer failed: Operation not permitted)" in capsys.readouterr().out
    )


def _runner_without(tools: set[str]):  # type: ignore[no-untyped-def]
    def runner(argv, timeout):  # type: ignore[no-untyped-def]
        if argv[0] in tools:
            return Output(None, f"{argv[0]} not found on PATH")
        raise AssertionError(f"unexpected command {argv}")

    return runner


def test_gpu_node_without_nvidia_smi_fails(tmp_path: Path) -> None:
    exp = load(_expect(tmp_path))
    raw = collect(
        exp, runner=_runner_without({"nvidia-smi", "dmesg", "journalctl"}), sysfs_root=tmp_path / "none"
    )
    report = evaluate(exp, raw)
    c = {c.name: c for c in report.checks}["gpu.count"]
    assert c.status == "fail" and c.reason == "nvidia-smi not found on PATH"
    assert not report.healthy


def test_cpu_node_skips_every_gpu_check(tmp_path: Path) -> None:
    exp = load(_expect(tmp_path, gpu__model="none", gpu__count=0))
    report = evaluate(exp, collect(exp, runner=_runner_without(set()), sysfs_root=tmp_path / "none"))
    gpu = [c for c in report.checks if c.name.startswith(("gpu.", "fm."))]
    assert gpu and all(c.status == "skip" and c.reason == "spec: no GPUs" for c in gpu)
    assert report.healthy


def test_drain_reason_is_one_line_of_at_most_250_chars() -> None:
    checks = [Check("n", f"fabric.mlx5_{i}_with_a_long_name", "fail", "v", "e", "r") for i in range(40)]
    reason = Report("n", checks).drain_reason()
    assert (
        len(reason) <= DRAIN_MAX
        and reason.startswith("lcm-health: fabric.mlx5_0")
        and reason.endswith("more")
    )
    assert "\n" not in reason


def test_drain_without_scontrol_says_so() -> None:
    r = Report("n", [Check("n", "gpu.ecc", "fail", "v", "e", "r")])
    msg = health_cli.drain(r, runner=lambda argv, t: Output(None, "scontrol not found on PATH"))
    assert msg == "could not drain n: scontrol not found on PATH"
