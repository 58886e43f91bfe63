"""Slurm hostlists in the spec (fabric.topology[].nodes / .switches): malformed ranges and names that are
not the cluster's compute hosts are caught in validation, naming the field, the value and what is expected."""

from __future__ import annotations

import copy
import random
from pathlib import Path
from typing import Any

import pytest

from lcm_runner.spec import load_cluster, validate
from lcm_runner.spec.hostlist import HostlistError, compress, expand

ROOT = Path(__file__).resolve().parents[2]
H200 = load_cluster(ROOT / "inventories/example-h200")
GROUPS = {
    "all": ["h200-head01", "h200-gpu01", "h200-gpu02"],
    "controller": ["h200-head01"],
    "compute": ["h200-gpu01", "h200-gpu02"],
    "monitoring": ["h200-head01"],
}


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("gpu[01-04]", ["gpu01", "gpu02", "gpu03", "gpu04"]),
        ("a[1,3-5]b,c07", ["a1b", "a3b", "a4b", "a5b", "c07"]),
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("leaf01", ["leaf01"]),
    ],
)
def test_expand(expr: str, names: list[str]) -> None:
    assert expand(expr) == names


@pytest.mark.parametrize(
    ("expr", "why"),
    [
        ("gpu[04-01]", "the range ends below its start"),
        ("gpu[01-04", "a '[' without its ']'"),
        ("gpu01-04]", "a ']' without its '['"),
        ("gpu[[1-2]]", "nested '[' is not allowed"),
        ("gpu[a-b]", "ranges are N or N-M with digits only"),
        ("gpu[]", "ranges are N or N-M with digits only"),
        ("gpu[1-2],,gpu3", "an empty name"),
        ("gpu[1-99999999]", "more than 65536 names"),
    ],
)
def test_expand_refuses(expr: str, why: str) -> None:
    with pytest.raises(HostlistError, match=None) as exc:
        expand(expr)
    assert why in str(exc.value)


def _topology(*switches: dict[str, Any]) -> dict[str, Any]:
    spec = copy.deepcopy(H200)
    spec["fabric"]["topology"] = list(switches)
    return spec


def _msgs(spec: dict[str, Any]) -> list[str]:
    return [str(e) for e in validate(spec, GROUPS)]


def test_example_topology_is_valid() -> None:
    assert _msgs(H200) == []


def test_malformed_node_range_names_field_value_and_expected() -> None:
    (msg,) = _msgs(_topology({"switch": "leaf01", "nodes": "h200-gpu[02-01]"}))
    assert msg == (
        'cluster.fabric.topology[0].nodes = "h200-gpu[02-01]": expected a Slurm hostlist: comma-separated '
        "names, each with optional [ranges] like gpu[01-04,07]; '02-01' in 'h200-gpu[02-01]': the range "
        "ends below its start"
    )


def test_unbalanced_bracket_in_switches() -> None:
    spec = _topology(
        {"switch": "leaf01", "nodes": "h200-gpu[01-02]"}, {"switch": "spine", "switches": "leaf[01"}
    )
    (msg,) = _msgs(spec)
    assert msg.startswith('cluster.fabric.topology[1].switches = "leaf[01": expected a Slurm hostlist')
    assert msg.endswith("a '[' without its ']'")


def test_child_switch_must_be_defined() -> None:
    spec = _topology(
        {"switch": "leaf01", "nodes": "h200-gpu[01-02]"}, {"switch": "spine", "switches": "leaf[01-02]"}
    )
    (msg,) = _msgs(spec)
    assert msg == (
        'cluster.fabric.topology[1].switches = "leaf[01-02]": expected switches defined in '
        "cluster.fabric.topology (unknown: leaf02)"
    )


def test_switch_names_unique() -> None:
    spec = _topology({"switch": "leaf01", "nodes": "h200-gpu01"}, {"switch": "leaf01", "nodes": "h200-gpu02"})
    (msg,) = _msgs(spec)
    assert msg.startswith('cluster.fabric.topology[].switch = ["leaf01", "leaf01"]: expected unique switch')


def test_topology_nodes_must_be_compute_hosts() -> None:
    (msg,) = _msgs(_topology({"switch": "leaf01", "nodes": "h200-gpu[01-03]"}))
    assert msg == (
        'cluster.fabric.topology[].nodes = ["h200-gpu03"]: expected inventory hosts of group compute '
        "(the nodes slurm.conf defines; not there: h200-gpu03)"
    )


def test_expanded_node_names_are_host_names() -> None:
    (msg,) = [m for m in _msgs(_topology({"switch": "leaf01", "nodes": "-gpu[1-2]"})) if "[0].nodes" in m]
    assert msg.startswith('cluster.fabric.topology[0].nodes = "-gpu[1-2]": expected')


def test_validate_without_inventory_skips_the_inventory_rule() -> None:
    assert validate(_topology({"switch": "leaf01", "nodes": "other[1-4]"})) == []


@pytest.mark.parametrize(
    ("names", "expr"),
    [
        ([f"gpu{i:04d}" for i in range(1, 1001)], "gpu[0001-1000]"),
        (["lab-node2", "lab-node1", "lab-node3", "lab-node1"], "lab-node[1-3]"),  # order, duplicates
        (["a9", "a10", "a11"], "a9,a[10-11]"),  # widths differ: a[9-11] would be right too, but ...
        (["b07", "b08", "b10", "b7"], "b7,b[07-08,10]"),  # ... b7 and b07 are different hosts
        (["ctl", "login"], "ctl,login"),  # no trailing number
        (["n1"], "n1"),
        ([], ""),
        (["rack1-n01", "rack1-n02", "rack2-n01"], "rack1-n[01-02],rack2-n01"),
    ],
)
def test_compress_cases(names: list[str], expr: str) -> None:
    assert compress(names) == expr
    if names:
        assert sorted(expand(expr)) == sorted(set(names))


def test_compress_round_trips_random_name_sets() -> None:
    rng = random.Random(20261203)
    for _ in range(300):
        names = set()
        for _ in range(rng.randint(1, 60)):
            prefix = rng.choice(["gpu", "a", "rack1-n", "x0y", ""]) or "h"
            width = rng.choice([1, 2, 4])
            names.add(f"{prefix}{rng.randint(0, 10**width - 1):0{width}d}")
        if rng.random() < 0.2:
            names.add(rng.choice(["ctl", "login-a", "db"]))
        expr = compress(sorted(names, key=lambda _: rng.random()))
        got = expand(expr)
        assert len(got) == len(names) and set(got) == names, (sorted(names), expr)


@pytest.mark.parametrize("bad", ["", "gpu[1]", "a,b"])
def test_compress_refuses_what_is_not_a_host_name(bad: str) -> None:
    with pytest.raises(HostlistError, match="is not a host name"):
        compress([bad])
