"""The cluster spec validator: the lab and example specs pass; each bad spec fails with its own message."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from lcm_runner.spec import SpecInvalid, load_cluster, load_schema, validate
from lcm_runner.spec.docs import render

ROOT = Path(__file__).resolve().parents[2]
LAB = ROOT / "inventories" / "lab"
EXAMPLE = ROOT / "inventories" / "example-h200"
GROUPS = {"all": ["ctl", "c1", "c2"], "controller": ["ctl"], "compute": ["c1", "c2"], "monitoring": ["ctl"]}


def lab() -> dict[str, Any]:
    return copy.deepcopy(load_cluster(LAB))


def h200() -> dict[str, Any]:
    return copy.deepcopy(load_cluster(EXAMPLE))


def test_lab_spec_valid() -> None:
    assert validate(lab(), GROUPS) == []


def test_example_h200_spec_valid() -> None:
    spec = h200()
    assert spec["gpu"] == {"model": "h200", "count_per_node": 8, "gres_type": "h200", "nvswitch": True}
    assert spec["fabric"]["hcas"] == [f"mlx5_{i}" for i in range(8)]
    assert validate(spec, GROUPS) == []


def test_schema_is_valid_json_schema_and_agrees() -> None:
    schema = load_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(lab(), schema)
    jsonschema.validate(h200(), schema)


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def f(spec: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        cur = spec
        for p in parents:
            cur = cur[p]
        cur[last] = value

    return f


def _del(path: str) -> Callable[[dict[str, Any]], None]:
    def f(spec: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        cur = spec
        for p in parents:
            cur = cur[p]
        del cur[last]

    return f


def _both(*fs: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    def f(spec: dict[str, Any]) -> None:
        for g in fs:
            g(spec)

    return f


# (id, base, mutation, field path in the message, text in the message); every case is a distinct mistake.
BAD_SPECS: list[tuple[str, Callable[[], dict[str, Any]], Callable[[dict[str, Any]], None], str, str]] = [
    ("wrong-type-count", lab, _set("gpu.count_per_node", "8"), "cluster.gpu.count_per_node", "type integer"),
    ("bool-is-not-int", lab, _set("gpu.count_per_node", True), "cluster.gpu.count_per_node", "type integer"),
    ("unknown-key", lab, _set("gpu.cont_per_node", 8), "cluster.gpu.cont_per_node", "unknown key"),
    ("unknown-top-key", lab, _set("partitions", []), "cluster.partitions", "unknown key"),
    ("missing-field", lab, _del("fabric.socket_ifname"), "cluster.fabric.socket_ifname", "required"),
    ("bad-enum", lab, _set("gpu.model", "a100"), "cluster.gpu.model", "one of none, h100, h200, b200"),
    ("bad-name", lab, _set("name", "Lab Cluster"), "cluster.name", "matching"),
    ("gpu-count-without-gres", h200, _set("gpu.gres_type", ""), "cluster.gpu.gres_type", "Gres=gpu:<type>:8"),
    ("gres-without-gpus", lab, _set("gpu.gres_type", "h200"), "cluster.gpu.gres_type", "count_per_node is 0"),
    (
        "model-none-with-gpus",
        lab,
        _set("gpu.count_per_node", 8),
        "cluster.gpu.count_per_node",
        "model is none",
    ),
    ("nvswitch-one-gpu", h200, _set("gpu.count_per_node", 1), "cluster.gpu.nvswitch", "needs >= 2"),
    ("ib-without-hcas", h200, _set("fabric.hcas", []), "cluster.fabric.hcas", "for fabric type infiniband"),
    (
        "ethernet-with-hcas",
        lab,
        _set("fabric.hcas", ["mlx5_0"]),
        "cluster.fabric.hcas",
        "fabric type ethernet",
    ),
    ("bad-hca-name", h200, _set("fabric.hcas", ["eth0"]), "cluster.fabric.hcas[0]", "mlx5_"),
    (
        "duplicate-hca",
        h200,
        _set("fabric.hcas", ["mlx5_0", "mlx5_0"]),
        "cluster.fabric.hcas",
        "appears twice",
    ),
    ("ib-rate-zero", h200, _set("fabric.rate_gbps", 0), "cluster.fabric.rate_gbps", "IB link rate"),
    ("bad-rate", h200, _set("fabric.rate_gbps", 300), "cluster.fabric.rate_gbps", "one of 0, 100"),
    (
        "roce-without-gid",
        h200,
        _set("fabric.type", "roce"),
        "cluster.fabric.roce_gid_index",
        "for fabric type roce",
    ),
    ("gid-on-ib", h200, _set("fabric.roce_gid_index", 3), "cluster.fabric.roce_gid_index", "null for fabric"),
    (
        "ckpt-outside-mount",
        lab,
        _set("storage.checkpoint_dir", "/data/ckpt"),
        "cluster.storage.checkpoint_dir",
        "inside storage.mountpoint",
    ),
    ("relative-mount", lab, _set("storage.mountpoint", "shared"), "cluster.storage.mountpoint", "matching"),
    (
        "nfs-server-group-unknown",
        lab,
        _both(_set("storage.type", "nfs"), _set("storage.nfs", {"server_group": "nas"})),
        "cluster.storage.nfs.server_group",
        "an inventory group with at least 1 host",
    ),
    (
        "nfs-version-float",
        lab,
        _both(_set("storage.type", "nfs"), _set("storage.nfs", {"version": 4.2})),
        "cluster.storage.nfs.version",
        "type string",
    ),
    (
        "nfs-soft-mount",
        lab,
        _both(_set("storage.type", "nfs"), _set("storage.nfs", {"mount_options": "rw,soft"})),
        "cluster.storage.nfs.mount_options",
        "matching",
    ),
    (
        "fstype-on-nfs",
        lab,
        _set("storage.fstype", "lustre"),
        "cluster.storage.fstype",
        "for storage type lab_shared",
    ),
    (
        "topology-without-nodes",
        h200,
        _set("fabric.topology", [{"switch": "leaf1"}]),
        "cluster.fabric.topology[0]",
        "nodes or switches",
    ),
    (
        "nfs-block-on-lab-storage",
        lab,
        _set("storage.nfs", {"server_group": "controller"}),
        "cluster.storage.nfs",
        "absent for storage type lab_shared",
    ),
    (
        "two-defaults",
        lab,
        _set(
            "slurm.partitions",
            [{"name": "a", "groups": ["compute"], "default": True}] * 1
            + [{"name": "b", "groups": ["compute"], "default": True}],
        ),
        "cluster.slurm.partitions[].default",
        "exactly one default",
    ),
    (
        "duplicate-partition",
        lab,
        _set(
            "slurm.partitions",
            [{"name": "a", "groups": ["compute"], "default": True}, {"name": "a", "groups": ["compute"]}],
        ),
        "cluster.slurm.partitions",
        "'a' repeats",
    ),
    (
        "bad-max-time",
        lab,
        _set("slurm.partitions", [{"name": "a", "groups": ["compute"], "default": True, "max_time": "2h"}]),
        "cluster.slurm.partitions[0].max_time",
        "matching",
    ),
    ("bad-proctrack", lab, _set("slurm.proctrack_type", "cgroup"), "cluster.slurm.proctrack_type", "one of"),
    ("nvidia-without-gpus", lab, _set("layers.nvidia", True), "cluster.layers.nvidia", "count_per_node is 0"),
    ("rdma-on-ethernet", lab, _set("layers.rdma", True), "cluster.layers.rdma", "fabric type ethernet"),
    ("pyxis-without-enroot", h200, _set("layers.enroot", False), "cluster.layers.pyxis", "layers.enroot"),
    ("layer-not-bool", lab, _set("layers.slurm", "yes"), "cluster.layers.slurm", "type boolean"),
    (
        "gid-out-of-range",
        h200,
        _both(_set("fabric.type", "roce"), _set("fabric.roce_gid_index", 300)),
        "cluster.fabric.roce_gid_index",
        "<= 255",
    ),
]


@pytest.mark.parametrize(
    ("base", "mutate", "path", "text"), [c[1:] for c in BAD_SPECS], ids=[c[0] for c in BAD_SPECS]
)
def test_bad_spec_rejected_with_its_message(base: Any, mutate: Any, path: str, text: str) -> None:
    spec = base()
    mutate(spec)
    errors = validate(spec, GROUPS)
    assert errors, "bad spec accepted"
    msgs = [str(e) for e in errors]
    assert any(e.path == path and text in str(e) for e in errors), msgs


def test_bad_spec_messages_are_distinct() -> None:
    seen = set()
    for _, base, mutate, _, _ in BAD_SPECS:
        spec = base()
        mutate(spec)
        seen.add(tuple(str(e) for e in validate(spec, GROUPS)))
    assert len(seen) == len(BAD_SPECS) >= 12


def test_message_names_field_value_and_expectation() -> None:
    spec = lab()
    spec["gpu"]["count_per_node"] = "eight"
    (err,) = validate(spec)
    assert str(err) == 'cluster.gpu.count_per_node = "eight": expected a value of type integer'


BAD_INVENTORIES = [
    ("no-controller", {"controller": [], "compute": ["c1"]}, "inventory.groups.controller", "exactly 1 host"),
    (
        "two-controllers",
        {"controller": ["a", "b"], "compute": ["c1"]},
        "inventory.groups.controller",
        "exactly 1",
    ),
    ("no-compute", {"controller": ["a"]}, "inventory.groups.compute", "at least 1 host"),
    (
        "host-in-exclusive-groups",
        {"controller": ["a"], "compute": ["a", "c1"]},
        "inventory.host.a",
        "exclusive",
    ),
    (
        "login-and-compute",
        {"controller": ["a"], "login": ["c1"], "compute": ["c1"]},
        "inventory.host.c1",
        "login / compute",
    ),
]


@pytest.mark.parametrize(
    ("groups", "path", "text"), [c[1:] for c in BAD_INVENTORIES], ids=[c[0] for c in BAD_INVENTORIES]
)
def test_bad_inventory_rejected(groups: dict[str, list[str]], path: str, text: str) -> None:
    errors = validate(lab(), groups)
    assert any(e.path == path and text in str(e) for e in errors), [str(e) for e in errors]


def test_partition_naming_unknown_group() -> None:
    spec = lab()
    spec["slurm"]["partitions"][0]["groups"] = ["gpu_nodes"]
    (err,) = validate(spec, GROUPS)
    assert err.path == "cluster.slurm.partitions[0].groups" and "an inventory group (known: " in str(err)


def test_partition_group_with_non_compute_hosts() -> None:
    spec = lab()
    spec["slurm"]["partitions"][0]["groups"] = ["monitoring"]
    (err,) = validate(spec, GROUPS)
    assert "ctl not in compute" in str(err)


def test_monitoring_layer_needs_monitoring_host() -> None:
    spec = lab()
    spec["layers"]["monitoring"] = True
    groups = {k: v for k, v in GROUPS.items() if k != "monitoring"}
    (err,) = validate(spec, groups)
    assert err.path == "inventory.groups.monitoring"


def test_load_cluster_without_cluster_key(tmp_path: Path) -> None:
    f = tmp_path / "cluster.yml"
    f.write_text("name: lab\n")
    with pytest.raises(SpecInvalid, match="top-level key `cluster`"):
        load_cluster(f)


def test_docs_spec_md_is_current() -> None:
    assert (ROOT / "docs" / "spec.md").read_text() == render(), (
        "docs/spec.md is stale: run scripts/gen-spec-docs"
    )
