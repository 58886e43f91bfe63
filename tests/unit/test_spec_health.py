"""Spec fields of the node health checks: cluster.gpu.nvlink and cluster.health (defaults, per-model
threshold merge, ranges, the nvlink rule)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from lcm_runner.spec import fill_defaults, load_schema, validate

ROOT = Path(__file__).resolve().parents[2]
LAB = yaml.safe_load((ROOT / "inventories/lab/group_vars/all/cluster.yml").read_text())["cluster"]
H200 = yaml.safe_load((ROOT / "inventories/example-h200/group_vars/all/cluster.yml").read_text())["cluster"]


def _with(base: dict[str, Any], **over: Any) -> dict[str, Any]:
    spec = copy.deepcopy(base)
    for dotted, value in over.items():
        cur = spec
        *parents, last = dotted.split("__")
        for p in parents:
            cur = cur.setdefault(p, {})
        cur[last] = value
    return spec


def _errors(spec: dict[str, Any]) -> str:
    """Every error of the spec, one per line (field: value, expected), "" when valid."""
    return "\n".join(f"{e.path}: {e.value!r}, expected {e.expected}" for e in validate(spec))


def test_defaults_filled() -> None:
    f = fill_defaults(LAB)
    assert f["gpu"]["nvlink"] is False
    h = f["health"]
    assert (h["xid_ignore"], h["pcie_gen"], h["pcie_width"], h["peer_ratio"]) == ([], 0, 0, 0.8)
    assert h["thresholds"]["h200"] == {
        "gemm_tflops": 550,
        "copy_gbps": 3500,
        "busbw_node_gbps": 300,
        "busbw_cluster_gbps": 0,
    }
    assert h["thresholds"]["h100"] == {
        "gemm_tflops": 500,
        "copy_gbps": 2500,
        "busbw_node_gbps": 300,
        "busbw_cluster_gbps": 0,
    }
    assert h["thresholds"]["b200"] == {
        "gemm_tflops": 1200,
        "copy_gbps": 6000,
        "busbw_node_gbps": 600,
        "busbw_cluster_gbps": 0,
    }
    assert h["thresholds"]["none"] == {
        "gemm_tflops": 0.002,
        "copy_gbps": 0.5,
        "busbw_node_gbps": 0.02,
        "busbw_cluster_gbps": 0.005,
    }


def test_one_model_override_keeps_that_models_other_defaults_and_the_other_models() -> None:
    f = fill_defaults(_with(H200, health__thresholds={"h200": {"gemm_tflops": 700}}))
    t = f["health"]["thresholds"]
    assert t["h200"] == {
        "gemm_tflops": 700,
        "copy_gbps": 3500,
        "busbw_node_gbps": 300,
        "busbw_cluster_gbps": 0,
    }
    assert t["h100"]["gemm_tflops"] == 500


def test_examples_stay_valid_and_schema_is_json_schema() -> None:
    assert _errors(LAB) == "" and _errors(H200) == ""
    jsonschema.Draft202012Validator.check_schema(load_schema())
    jsonschema.validate(fill_defaults(H200), load_schema())


@pytest.mark.parametrize(
    ("over", "path", "text"),
    [
        ({"health__xid_ignore": [0]}, "cluster.health.xid_ignore[0]", ">= 1"),
        ({"health__xid_ignore": [1024]}, "cluster.health.xid_ignore[0]", "<= 1023"),
        ({"health__xid_ignore": [13, 13]}, "cluster.health.xid_ignore", "unique"),
        ({"health__pcie_gen": 7}, "cluster.health.pcie_gen", "<= 6"),
        ({"health__pcie_width": 33}, "cluster.health.pcie_width", "<= 32"),
        ({"health__peer_ratio": 0.05}, "cluster.health.peer_ratio", ">= 0.1"),
        ({"health__peer_ratio": 1.5}, "cluster.health.peer_ratio", "<= 1.0"),
        ({"health__thresholds": {"a100": {}}}, "cluster.health.thresholds.a100", "no such field"),
        (
            {"health__thresholds": {"h200": {"gemm_tflops": -1}}},
            "cluster.health.thresholds.h200.gemm_tflops",
            ">= 0",
        ),
        (
            {"health__thresholds": {"h200": {"tflops": 1}}},
            "cluster.health.thresholds.h200.tflops",
            "no such field",
        ),
        ({"health__bogus": 1}, "cluster.health.bogus", "no such field"),
    ],
)
def test_bad_health_fields(over: dict[str, Any], path: str, text: str) -> None:
    err = _errors(_with(H200, **over))
    assert path in err and text in err, err


def test_nvlink_needs_two_gpus() -> None:
    spec = _with(H200, gpu__count_per_node=1, gpu__nvswitch=False, gpu__nvlink=True)
    err = _errors(spec)
    assert "cluster.gpu.nvlink" in err and "needs >= 2" in err, err
    assert _errors(_with(H200, gpu__nvlink=True)) == ""


def test_nvswitch_without_nvlink_is_valid_nvswitch_implies_it() -> None:
    assert _errors(_with(H200, gpu__nvswitch=True, gpu__nvlink=False)) == ""
