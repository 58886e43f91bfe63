"""The cluster spec validator: the lab and example specs pass; each bad spec fails with its own message."""

from __future__ import annotations

import copy
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from lcm_runner.spec import SpecInvalid, load_cluster, load_inventory_groups, load_schema, validate
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
    groups = {**GROUPS, "compute": ["h200-gpu01", "h200-gpu02"]}
    assert validate(spec, groups) == []


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
    ("relative-mount", lab, _set("storage.mountpoint", "shared"), "cluster.storage.mountpoint", "relative"),
    # Paths become shell words and mount arguments: normalised, no shell characters, never `..`.
    (
        "ckpt-dotdot-escapes-mount",
        lab,
        _set("storage.checkpoint_dir", "/shared/../etc"),
        "cluster.storage.checkpoint_dir",
        "'..' components are not allowed",
    ),
    (
        "ckpt-dot-component",
        lab,
        _set("storage.checkpoint_dir", "/shared/./x"),
        "cluster.storage.checkpoint_dir",
        "'.' components are not allowed",
    ),
    (
        "ckpt-double-slash",
        lab,
        _set("storage.checkpoint_dir", "/shared//x"),
        "cluster.storage.checkpoint_dir",
        "'//' is not allowed",
    ),
    (
        "ckpt-semicolon",
        lab,
        _set("storage.checkpoint_dir", "/shared/x;y"),
        "cluster.storage.checkpoint_dir",
        "characters ';' are not allowed",
    ),
    (
        "ckpt-dollar",
        lab,
        _set("storage.checkpoint_dir", "/shared/ckpt$HOME"),
        "cluster.storage.checkpoint_dir",
        "characters '$' are not allowed",
    ),
    (
        "mount-trailing-slash",
        lab,
        _both(_set("storage.mountpoint", "/shared/"), _set("storage.checkpoint_dir", "/shared/ck")),
        "cluster.storage.mountpoint",
        "trailing '/'",
    ),
    (
        "scratch-newline",
        lab,
        _set("storage.local_scratch", "/var/lib/lcm\n-local"),
        "cluster.storage.local_scratch",
        "control characters are not allowed ('\\n')",
    ),
    (
        "scratch-trailing-newline",
        lab,
        _set("storage.local_scratch", "/var/lib/lcm-local\n"),
        "cluster.storage.local_scratch",
        "control characters",
    ),
    (
        "scratch-on-shared-storage",
        lab,
        _set("storage.local_scratch", "/shared/scratch"),
        "cluster.storage.local_scratch",
        "node-local path",
    ),
    (
        "mount-is-root",
        lab,
        _set("storage.mountpoint", "/"),
        "cluster.storage.mountpoint",
        "other than / (the root)",
    ),
    (
        "export-path-backtick",
        lab,
        _both(_set("storage.type", "nfs"), _set("storage.nfs", {"export_path": "/srv/`id`"})),
        "cluster.storage.nfs.export_path",
        "characters '`' are not allowed",
    ),
    (
        "mount-options-shell",
        lab,
        _both(_set("storage.type", "nfs"), _set("storage.nfs", {"mount_options": "rw,hard;reboot"})),
        "cluster.storage.nfs.mount_options",
        "matching",
    ),
    (
        "export-options-space",
        lab,
        _both(_set("storage.type", "nfs"), _set("storage.nfs", {"export_options": "rw, sync"})),
        "cluster.storage.nfs.export_options",
        "matching",
    ),
    ("name-trailing-newline", lab, _set("name", "lab\n"), "cluster.name", "matching"),
    (
        "partition-shell",
        lab,
        _set("slurm.partitions", [{"name": "batch;id", "groups": ["compute"], "default": True}]),
        "cluster.slurm.partitions[0].name",
        "matching",
    ),
    (
        "partition-leading-dash",
        lab,
        _set("slurm.partitions", [{"name": "-batch", "groups": ["compute"], "default": True}]),
        "cluster.slurm.partitions[0].name",
        "matching",
    ),
    (
        "switch-leading-dash",
        h200,
        _set("fabric.topology", [{"switch": "-leaf", "nodes": "h200-gpu[01-02]"}]),
        "cluster.fabric.topology[0].switch",
        "matching",
    ),
    (
        "topology-nodes-subshell",
        h200,
        _set("fabric.topology", [{"switch": "leaf01", "nodes": "gpu$(id)"}]),
        "cluster.fabric.topology[0].nodes",
        "matching",
    ),
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


# ----------------------------------------------------------------------------- names and paths are safe

HOSTILE_HOSTS = [
    ("node1;rm -rf /", "';', ' ', '/' are not allowed"),
    ("$(id)", "'$', '(', ')' are not allowed"),
    ("`id`", "'`' are not allowed"),
    ("-oProxyCommand=x", "leading '-'"),
    ("a b", "' ' are not allowed"),
    ("node\n2", "'\\n' are not allowed"),
    ("node'1", '"\'" are not allowed'),
    ("a" * 64, "at most 63 characters"),
    (".".join(["a" * 63] * 4), "it has 255 characters"),
    ("node-", "may not start or end with '-'"),
    ("node..x", "empty labels"),
    ("gpu_01", "'_' are not allowed"),
    ("", "it is empty"),
]


@pytest.mark.parametrize(("host", "why"), HOSTILE_HOSTS, ids=[repr(h)[:20] for h, _ in HOSTILE_HOSTS])
def test_hostile_host_name_rejected(host: str, why: str) -> None:
    groups = {**GROUPS, "compute": ["c1", host], "all": [*GROUPS["all"], host]}
    errors = [e for e in validate(lab(), groups) if e.value == host]
    assert len(errors) == 1, [str(e) for e in validate(lab(), groups)]
    (err,) = errors
    expected_path = f"inventory.host.{host}" if host.isprintable() else f"inventory.host.{host!r}"
    assert err.path == expected_path
    assert "RFC 1123 host name" in err.expected and why in err.expected, str(err)
    assert "\n" not in str(err), "a newline in a host name must show escaped"


@pytest.mark.parametrize(
    "host",
    ["lab-ctl", "lab-node1", "h200-gpu01", "10.10.0.10", "node.example.com", "N1", "a" * 63, "x"],
)
def test_legitimate_host_names_accepted(host: str) -> None:
    groups = {**GROUPS, "compute": ["c1", host]}
    assert validate(lab(), groups) == []


def test_253_character_host_name_accepted() -> None:
    host = ".".join(["a" * 63] * 3 + ["b" * 61])
    assert len(host) == 253
    assert validate(lab(), {**GROUPS, "compute": [host]}) == []


HOSTILE_PATHS = [
    ("/shared/../etc", "'..' components are not allowed"),
    ("/shared/..", "'..' components are not allowed"),
    ("/shared/./x", "'.' components are not allowed"),
    ("/shared//x", "'//' is not allowed"),
    ("relative/path", "it is relative"),
    ("/shared/x;y", "';' are not allowed"),
    ("/shared/ckpt$HOME", "'$' are not allowed"),
    ("/shared/a b", "' ' are not allowed"),
    ("/shared/x\n", "control characters"),
    ("/shared/x\x00y", "control characters"),
    ("/shared/a:b", "':' are not allowed"),
    ("/shared/a,b", "',' are not allowed"),
    ("/shared/'q'", '"\'" are not allowed'),
    ("/shared/", "trailing '/'"),
    ("", "it is empty"),
]
GOOD_PATHS = [
    "/shared",
    "/shared/checkpoints",
    "/lustre/lcm/ckpt-2026_01",
    "/home/u/.cache",
    "/a/..b/c+d@e",
]


@pytest.mark.parametrize(("value", "why"), HOSTILE_PATHS, ids=[repr(v)[:24] for v, _ in HOSTILE_PATHS])
def test_hostile_checkpoint_dir_rejected_with_reason(value: str, why: str) -> None:
    spec = lab()
    spec["storage"]["checkpoint_dir"] = value
    errors = [e for e in validate(spec, GROUPS) if e.path == "cluster.storage.checkpoint_dir"]
    assert len(errors) == 1 and why in errors[0].expected, [str(e) for e in validate(spec, GROUPS)]
    assert "absolute, normalised path" in errors[0].expected


@pytest.mark.parametrize("value", GOOD_PATHS)
def test_legitimate_paths_accepted(value: str) -> None:
    spec = lab()
    spec["storage"].update(mountpoint=value, checkpoint_dir=value, type="nfs", nfs={"export_path": value})
    assert validate(spec, GROUPS) == []


def test_every_path_field_uses_the_safe_path_pattern() -> None:
    """Every absolute-path field of the schema is `x-safe: path` with safe.PATH_PATTERN (no `^/[^ ]*$`)."""
    from lcm_runner.spec.safe import PATH_PATTERN

    found: list[str] = []

    def walk(s: dict[str, Any], path: str) -> None:
        if "pattern" in s and (s["pattern"].startswith("^/") or s.get("x-safe") == "path"):
            assert s["pattern"] == PATH_PATTERN and s.get("x-safe") == "path", path
            assert str(s["description"]).startswith("Absolute"), path
            found.append(path)
        for key, sub in s.get("properties", {}).items():
            walk(sub, f"{path}.{key}")
        if isinstance(s.get("items"), dict):
            walk(s["items"], f"{path}[]")

    walk(load_schema(), "cluster")
    assert found == [
        "cluster.storage.mountpoint",
        "cluster.storage.checkpoint_dir",
        "cluster.storage.local_scratch",
        "cluster.storage.nfs.export_path",
        "cluster.monitoring.textfile_dir",
    ]


@pytest.mark.parametrize("value", [v for v, _ in HOSTILE_PATHS] + GOOD_PATHS + ["/", "/.x", "/..."])
def test_path_pattern_agrees_with_path_problem(value: str) -> None:
    """The schema's pattern (ECMA `$`, as the validator reads it) and safe.path_problem say the same."""
    from lcm_runner.spec.safe import PATH_PATTERN, path_problem
    from lcm_runner.spec.schema import _regex

    assert (_regex(PATH_PATTERN).search(value) is not None) == (path_problem(value) is None)


def test_pattern_dollar_is_end_of_input_only() -> None:
    """Python's `$` also matches before a trailing newline; the validator's patterns do not."""
    from lcm_runner.spec.schema import _regex

    assert _regex("^[a-z]+$").search("lab") and not _regex("^[a-z]+$").search("lab\n")
    assert _regex(r"^a\$[$]$").search("a$$") and not _regex(r"^a\$[$]$").search("a$$\n")


def test_spec_rules_refuse_dotdot_even_without_the_schema() -> None:
    """spec_rules compares paths only after refusing `..`: /shared/../etc is not inside /shared."""
    from lcm_runner.spec.rules import spec_rules

    spec = lab()
    spec["storage"]["checkpoint_dir"] = "/shared/../etc"
    (err,) = spec_rules(spec)
    assert err.path == "cluster.storage.checkpoint_dir"
    assert "inside storage.mountpoint (/shared)" in err.expected and "'..' components" in err.expected


def test_hostile_value_shown_escaped_in_message() -> None:
    spec = lab()
    spec["storage"]["checkpoint_dir"] = "/shared/x\nrm -rf /"
    msgs = [str(e) for e in validate(spec)]
    assert msgs and all("\n" not in m for m in msgs), msgs
    assert any('"/shared/x\\nrm -rf /"' in m for m in msgs), msgs


@pytest.mark.skipif(shutil.which("ansible-inventory") is None, reason="needs ansible-inventory")
@pytest.mark.parametrize("inventory", [LAB, EXAMPLE], ids=["lab", "example-h200"])
def test_example_inventories_validate_with_their_hosts(inventory: Path) -> None:
    groups = load_inventory_groups(inventory)
    assert groups["compute"], groups
    assert validate(load_cluster(inventory), groups) == []


def test_run_config_partition_pattern_is_the_spec_one() -> None:
    from lcm_runner.spec.safe import PARTITION_RE

    part = load_schema()["properties"]["slurm"]["properties"]["partitions"]["items"]["properties"]["name"]
    assert part["pattern"] == f"^{PARTITION_RE.pattern}$"
