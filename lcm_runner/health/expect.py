"""The node's expectation (/etc/lcm/node-health.json, written by roles/node_health): JSON schema 1.

Read by `lcm-runner health check` and `lcm-runner probe`; the contract is documented in docs/health.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = 1
MODELS = ("none", "h100", "h200", "b200")
FABRICS = ("infiniband", "roce", "ethernet")


class ExpectError(ValueError):
    """The expectation file is missing, not JSON, or does not follow the contract (exit 2)."""


@dataclass(frozen=True)
class GpuExpect:
    model: str = "none"
    count: int = 0
    driver: str = ""
    persistence: bool = True
    ecc: bool = True
    pcie_gen: int = 0  # 0 = the GPU's own max
    pcie_width: int = 0  # 0 = the GPU's own max
    nvlink: bool = False
    nvswitch: bool = False
    fabric_manager: bool = False
    xid_ignore: tuple[int, ...] = ()

    @property
    def product(self) -> str:
        """The word the product name must contain (h200 -> 'H200')."""
        return self.model.upper()


@dataclass(frozen=True)
class FabricExpect:
    type: str = "ethernet"
    hcas: tuple[str, ...] = ()
    rate_gbps: int = 0
    port: int = 1


@dataclass(frozen=True)
class ProbeExpect:
    gemm_tflops: float = 0.0
    copy_gbps: float = 0.0
    busbw_node_gbps: float = 0.0
    busbw_cluster_gbps: float = 0.0
    peer_ratio: float = 0.8
    gemm_n: int = 8192
    copy_mib: int = 4096
    allreduce_max_mib: int = 1024


@dataclass(frozen=True)
class Expectation:
    node: str
    gpu: GpuExpect = field(default_factory=GpuExpect)
    fabric: FabricExpect = field(default_factory=FabricExpect)
    probes: ProbeExpect = field(default_factory=ProbeExpect)
    schema: int = SCHEMA


_TYPES: dict[str, tuple[type, ...]] = {
    "bool": (bool,),
    "int": (int,),
    "float": (int, float),
    "str": (str,),
}


def _field(section: str, data: dict[str, Any], key: str, kind: str, default: Any) -> Any:
    if key not in data:
        return default
    value = data[key]
    ok = isinstance(value, _TYPES[kind]) and not (kind in ("int", "float") and isinstance(value, bool))
    if not ok:
        raise ExpectError(f"{section}.{key}: {value!r} is not a {kind}")
    return float(value) if kind == "float" else value


def _section(raw: dict[str, Any], name: str) -> dict[str, Any]:
    value = raw.get(name, {})
    if not isinstance(value, dict):
        raise ExpectError(f"{name}: expected an object, got {type(value).__name__}")
    return value


def from_dict(raw: Any) -> Expectation:
    if not isinstance(raw, dict):
        raise ExpectError("the expectation is not a JSON object")
    if raw.get("schema") != SCHEMA:
        raise ExpectError(f"schema: {raw.get('schema')!r}, this lcm-runner reads schema {SCHEMA}")
    node = raw.get("node")
    if not isinstance(node, str) or not node:
        raise ExpectError(f"node: {node!r} is not a node name")
    g, f, p = _section(raw, "gpu"), _section(raw, "fabric"), _section(raw, "probes")
    d = GpuExpect()
    ignore = g.get("xid_ignore", [])
    if not isinstance(ignore, list) or not all(
        isinstance(x, int) and not isinstance(x, bool) for x in ignore
    ):
        raise ExpectError(f"gpu.xid_ignore: {ignore!r} is not a list of integers")
    gpu = GpuExpect(
        model=_field("gpu", g, "model", "str", d.model),
        count=_field("gpu", g, "count", "int", d.count),
        driver=_field("gpu", g, "driver", "str", d.driver),
        persistence=_field("gpu", g, "persistence", "bool", d.persistence),
        ecc=_field("gpu", g, "ecc", "bool", d.ecc),
        pcie_gen=_field("gpu", g, "pcie_gen", "int", d.pcie_gen),
        pcie_width=_field("gpu", g, "pcie_width", "int", d.pcie_width),
        nvlink=_field("gpu", g, "nvlink", "bool", d.nvlink),
        nvswitch=_field("gpu", g, "nvswitch", "bool", d.nvswitch),
        fabric_manager=_field("gpu", g, "fabric_manager", "bool", d.fabric_manager),
        xid_ignore=tuple(ignore),
    )
    if gpu.model not in MODELS:
        raise ExpectError(f"gpu.model: {gpu.model!r} is not one of {', '.join(MODELS)}")
    if gpu.count < 0 or (gpu.count == 0) != (gpu.model == "none"):
        raise ExpectError(f"gpu.count {gpu.count} with model {gpu.model!r}: 0 exactly when the model is none")
    hcas = f.get("hcas", [])
    if not isinstance(hcas, list) or not all(isinstance(h, str) for h in hcas):
        raise ExpectError(f"fabric.hcas: {hcas!r} is not a list of HCA names")
    fabric = FabricExpect(
        type=_field("fabric", f, "type", "str", "ethernet"),
        hcas=tuple(hcas),
        rate_gbps=_field("fabric", f, "rate_gbps", "int", 0),
        port=_field("fabric", f, "port", "int", 1),
    )
    if fabric.type not in FABRICS:
        raise ExpectError(f"fabric.type: {fabric.type!r} is not one of {', '.join(FABRICS)}")
    dp = ProbeExpect()
    probes = ProbeExpect(
        **{
            k: _field("probes", p, k, "int" if isinstance(v, int) else "float", v)
            for k, v in dp.__dict__.items()
        }
    )
    return Expectation(node=node, gpu=gpu, fabric=fabric, probes=probes)


def load(path: str | Path) -> Expectation:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ExpectError(f"{path}: cannot read the expectation ({e.strerror or e})") from e
    try:
        raw = json.loads(text)
    except ValueError as e:
        raise ExpectError(f"{path}: not JSON ({e})") from e
    try:
        return from_dict(raw)
    except ExpectError as e:
        raise ExpectError(f"{path}: {e}") from e
