"""roles/node_health run for real on localhost: the expectation it renders (lab and H200 specs, the lock's
driver, per-model thresholds, busbw_cluster 0 -> 70% of the HCA line rate), the manifest, the run phase."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from _role_run import H200_GPU, IB_FABRIC, run_role, spec

from lcm_runner.health.expect import from_dict

RUNNER = str(Path(sys.executable).parent / "lcm-runner")


def _vars(tmp_path: Path, **over: Any) -> dict[str, Any]:
    return {
        "node_health_expect_path": str(tmp_path / "etc/node-health.json"),
        "node_health_report_dir": str(tmp_path / "health"),
        "lcm_managed_dir": str(tmp_path / "managed.d"),
        "node_health_runner": str(tmp_path / "no-runner"),
    } | over


def _expectation(tmp_path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((tmp_path / "etc/node-health.json").read_text())
    return data


def test_lab_spec_expectation(tmp_path: Path) -> None:
    r = run_role("node_health", tmp_path, _vars(tmp_path, cluster=spec()))
    assert r.rc == 0, r.failed_msgs or r.stdout[-2000:]
    exp = _expectation(tmp_path)
    assert exp == {
        "schema": 1,
        "node": "localhost",
        "gpu": {
            "model": "none",
            "count": 0,
            "driver": "",
            "persistence": True,
            "ecc": True,
            "pcie_gen": 0,
            "pcie_width": 0,
            "nvlink": False,
            "nvswitch": False,
            "fabric_manager": False,
            "xid_ignore": [],
        },
        "fabric": {"type": "ethernet", "hcas": [], "rate_gbps": 0, "port": 1},
        "probes": {
            "gemm_tflops": 0.002,
            "copy_gbps": 0.5,
            "busbw_node_gbps": 0.02,
            "busbw_cluster_gbps": 0.005,
            "peer_ratio": 0.8,
            "gemm_n": 512,
            "copy_mib": 64,
            "allreduce_max_mib": 16,
        },
    }
    from_dict(exp)  # the contract the CLI reads
    assert oct((tmp_path / "etc/node-health.json").stat().st_mode & 0o777) == "0o644"
    manifest = json.loads((tmp_path / "managed.d/node_health.json").read_text())
    assert manifest["files"] == [str(tmp_path / "etc/node-health.json")]
    assert any("checks skipped" in str(x["result"].get("msg", "")) for x in r.results)
    again = run_role("node_health", tmp_path, _vars(tmp_path, cluster=spec()))
    assert again.rc == 0 and again.changed == 0


def test_h200_spec_expectation(tmp_path: Path) -> None:
    health = {"xid_ignore": [13, 43], "thresholds": {"h200": {"gemm_tflops": 700}}}
    cluster = spec(gpu=H200_GPU, fabric=IB_FABRIC, health=health)
    r = run_role("node_health", tmp_path, _vars(tmp_path, cluster=cluster, node_health_node="h200-gpu01"))
    assert r.rc == 0, r.failed_msgs
    exp = _expectation(tmp_path)
    assert exp["node"] == "h200-gpu01"
    assert exp["gpu"] | {"xid_ignore": None} == {
        "model": "h200",
        "count": 8,
        "driver": "580.159.04",
        "persistence": True,
        "ecc": True,
        "pcie_gen": 0,
        "pcie_width": 0,
        "nvlink": True,
        "nvswitch": True,
        "fabric_manager": True,
        "xid_ignore": None,
    }
    assert exp["gpu"]["xid_ignore"] == [13, 43]
    assert exp["fabric"] == {"type": "infiniband", "hcas": IB_FABRIC["hcas"], "rate_gbps": 400, "port": 1}
    # the one override, the model's other defaults, busbw_cluster 0 -> 0.7 * 400 * 8 / 8 = 280
    assert exp["probes"] | {} == {
        "gemm_tflops": 700.0,
        "copy_gbps": 3500.0,
        "busbw_node_gbps": 300.0,
        "busbw_cluster_gbps": 280.0,
        "peer_ratio": 0.8,
        "gemm_n": 8192,
        "copy_mib": 4096,
        "allreduce_max_mib": 1024,
    }


def test_debian_driver_source_reads_the_package_version(tmp_path: Path) -> None:
    cluster = spec(gpu=H200_GPU, fabric=IB_FABRIC)
    r = run_role(
        "node_health", tmp_path, _vars(tmp_path, cluster=cluster, node_health_driver_source="debian")
    )
    assert r.rc == 0, r.failed_msgs
    assert _expectation(tmp_path)["gpu"]["driver"] == "535.309.01"


def test_run_phase_healthy_cpu_node(tmp_path: Path) -> None:
    r = run_role("node_health", tmp_path, _vars(tmp_path, cluster=spec(), node_health_runner=RUNNER))
    assert r.rc == 0, r.failed_msgs
    report = json.loads((tmp_path / "health/last.json").read_text())
    assert report["healthy"] and (tmp_path / "health/last.md").exists()


def test_run_phase_unhealthy_lists_failing_checks(tmp_path: Path) -> None:
    cluster = spec(gpu=H200_GPU, fabric=IB_FABRIC)
    r = run_role("node_health", tmp_path, _vars(tmp_path, cluster=cluster, node_health_runner=RUNNER))
    assert r.rc != 0
    (msg,) = r.failed_msgs
    assert msg.startswith("localhost: UNHEALTHY")
    assert "gpu.count = nvidia-smi unavailable (expected 8; nvidia-smi not found on PATH)" in msg
    assert "fabric.hcas_present" in msg
