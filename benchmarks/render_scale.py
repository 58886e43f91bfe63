"""Cluster-wide files of a generated large cluster (issue 17: 1,000 nodes x 8 GPUs in < 10 s).

    python benchmarks/render_scale.py [--nodes 1000] [--out benchmarks/results]

Generates the example H200 spec at N compute nodes (gpu0001..gpuNNNN, 8 H200 each, leaf switches of 32
nodes under one spine, 64 free slots), validates it with the inventory groups (lcm_runner.spec.validate,
what playbooks/validate.yml runs), and renders slurm.conf, gres.conf, topology.conf and prometheus.yml with
the roles' own templates through Ansible's templating engine (tests/unit/_role_render.py, as the template
tests do) from synthetic per-host facts. Times each part, and the same for 2 nodes in the same run (the
ratio is the figure; absolute seconds beside it). Writes render-scale-<UTC stamp>.json under --out.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "unit"))

from _role_render import render, validated  # noqa: E402

from lcm_runner.lock import release_lock  # noqa: E402
from lcm_runner.spec import validate  # noqa: E402

H200 = yaml.safe_load((REPO / "inventories/example-h200/group_vars/all/cluster.yml").read_text())["cluster"]
LOCK = release_lock(yaml.safe_load((REPO / "versions.lock.yml").read_text())["lcm_lock"], "bookworm")
LEAF = 32  # nodes per leaf switch
SLOTS = 64  # free node slots beyond the N nodes
FILES = (
    ("slurm", "slurm.conf.j2"),
    ("slurm", "gres.conf.j2"),
    ("slurm", "topology.conf.j2"),
    ("prometheus", "prometheus.yml.j2"),
)


def names(n: int) -> list[str]:
    return [f"gpu{i:04d}" for i in range(1, n + 1)]


def spec(n: int) -> dict[str, Any]:
    """The example H200 spec at n nodes: topology of leaf switches (32 nodes each) and a spine."""
    s = copy.deepcopy(H200)
    s["name"] = f"h200-{n}"
    leaves = []
    for k, lo in enumerate(range(1, n + 1, LEAF), start=1):
        hi = min(lo + LEAF - 1, n)
        nodes = f"gpu{lo:04d}" if lo == hi else f"gpu[{lo:04d}-{hi:04d}]"
        leaves.append({"switch": f"leaf{k:03d}", "nodes": nodes})
    spines = f"leaf[001-{len(leaves):03d}]" if len(leaves) > 1 else "leaf001"
    spine = {"switch": "spine01", "switches": spines}
    s["fabric"]["topology"] = [*leaves, spine]
    s["slurm"]["node_slots"] = f"gpu[0001-{n + SLOTS:04d}]"
    return s


def groups(n: int) -> dict[str, list[str]]:
    compute = names(n)
    return {
        "all": ["head01", *compute],
        "cluster": ["head01", *compute],
        "controller": ["head01"],
        "compute": compute,
        "login": [],
        "monitoring": ["head01"],
    }


def facts(host: str, gpu: bool) -> dict[str, Any]:
    return {
        "ansible_hostname": host,
        "ansible_processor_vcpus": 224 if gpu else 64,
        "ansible_processor_count": 2,
        "ansible_processor_cores": 56 if gpu else 16,
        "ansible_processor_threads_per_core": 2,
        "ansible_memtotal_mb": 2_000_000 if gpu else 256_000,
    }


def variables(n: int) -> dict[str, Any]:
    g = groups(n)
    return {
        "cluster": spec(n),
        "groups": g,
        "hostvars": {h: facts(h, h != "head01") for h in g["all"]},
        "inventory_hostname": "head01",
        "_monitoring_listen_address": "10.0.0.10",
        "_slurm_has_nvml": False,
        "lcm_lock": LOCK,
    }


def run(n: int) -> dict[str, Any]:
    """Validate and render at n nodes: seconds per part, the rendered texts' line counts, the texts."""
    out: dict[str, Any] = {"nodes": n, "seconds": {}, "lines": {}, "texts": {}}
    v = variables(n)
    t0 = time.perf_counter()
    errors = validate(v["cluster"], v["groups"])
    out["seconds"]["validate"] = time.perf_counter() - t0
    if errors:
        raise SystemExit(f"the generated {n}-node spec does not validate: {errors[:3]}")
    v = validated(v)
    for role, template in FILES:
        t0 = time.perf_counter()
        text = render(role, template, v)
        name = template.removesuffix(".j2")
        out["seconds"][name] = time.perf_counter() - t0
        out["lines"][name] = len(text.splitlines())
        out["texts"][name] = text
    out["seconds"]["total"] = sum(out["seconds"].values())
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    a = ap.parse_args(argv)
    if a.nodes < 2:
        ap.error("--nodes must be at least 2")
    run(2)  # warm-up: imports, template compilation
    small, big = run(2), run(a.nodes)
    result = {
        "benchmark": "render_scale",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"python": platform.python_version(), "machine": platform.machine()},
        "nodes": a.nodes,
        "gpus_per_node": 8,
        "seconds": {k: round(x, 3) for k, x in big["seconds"].items()},
        "seconds_2_nodes": {k: round(x, 3) for k, x in small["seconds"].items()},
        "ratio_to_2_nodes": round(big["seconds"]["total"] / small["seconds"]["total"], 2),
        "target_s": 10.0,
        "of_target": round(big["seconds"]["total"] / 10.0, 3),
        "lines": big["lines"],
        "slurm_conf_node_lines": [
            ln
            for ln in big["texts"]["slurm.conf"].splitlines()
            if ln.startswith(("NodeName=", "PartitionName="))
        ],
    }
    a.out.mkdir(parents=True, exist_ok=True)
    path = a.out / f"render-scale-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("nodes", "seconds", "ratio_to_2_nodes", "lines")}, indent=1))
    print(f"wrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
