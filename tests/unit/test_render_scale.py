"""The generated 1,000-node x 8-GPU cluster of benchmarks/render_scale.py: the spec validates with its
inventory groups, and every cluster-wide file renders with hostlist ranges, not one line per node (the
timing is the benchmark's; here only what the files say)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from _benchmarks import load
from _role_render import REPO

from lcm_runner.spec import validate
from lcm_runner.spec.hostlist import expand

render_scale = load("render_scale")
TOOLS = REPO / ".cache" / "tools" / "bin"


@pytest.fixture(scope="module")
def thousand() -> dict:
    return render_scale.run(1000)


def test_a_thousand_node_spec_validates_and_slurm_conf_uses_ranges(thousand: dict) -> None:
    conf = [ln for ln in thousand["texts"]["slurm.conf"].splitlines() if ln and not ln.startswith("#")]
    nodes = [ln for ln in conf if ln.startswith("NodeName=")]
    assert [ln.split()[0] for ln in nodes] == ["NodeName=gpu[0001-1000]", "NodeName=gpu[1001-1064]"]
    assert nodes[0].endswith("Gres=gpu:h200:8 State=UNKNOWN") and nodes[1].endswith("State=FUTURE")
    partition = next(ln for ln in conf if ln.startswith("PartitionName="))
    assert "Nodes=gpu[0001-1000] " in partition
    assert thousand["lines"]["slurm.conf"] < 80


def test_topology_and_gres_do_not_grow_with_the_node_count(thousand: dict) -> None:
    topo = [ln for ln in thousand["texts"]["topology.conf"].splitlines() if ln.startswith("SwitchName=")]
    assert len(topo) == 32 + 1  # 32 leaves of 32 nodes (the last one 8) + the spine
    leaves = [expand(ln.split("Nodes=")[1]) for ln in topo[:-1]]
    assert [n for leaf in leaves for n in leaf] == render_scale.names(1000)
    assert topo[-1] == "SwitchName=spine01 Switches=leaf[001-032]"
    gres = [ln for ln in thousand["texts"]["gres.conf"].splitlines() if ln and not ln.startswith("#")]
    assert gres == ["Name=gpu Type=h200 File=/dev/nvidia[0-7]"]


def test_prometheus_scrapes_every_node_and_promtool_accepts_it(thousand: dict, tmp_path: Path) -> None:
    text = thousand["texts"]["prometheus.yml"]
    jobs = {j["job_name"]: j for j in yaml.safe_load(text)["scrape_configs"]}
    node_targets = {c["labels"]["node"] for c in jobs["node"]["static_configs"]}
    assert node_targets == {"head01", *render_scale.names(1000)}
    assert len(jobs["dcgm"]["static_configs"]) == 1000
    cfg = yaml.safe_load(text)
    cfg["rule_files"] = []  # the rule files are rendered elsewhere (test_monitoring_roles)
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    promtool = TOOLS / "promtool"
    if not promtool.exists():
        pytest.fail(f"{promtool} is missing: run scripts/bootstrap")
    p = subprocess.run([str(promtool), "check", "config", str(tmp_path / "prometheus.yml")],
                       capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr


def test_a_leaf_naming_an_unknown_host_is_a_spec_error() -> None:
    v = render_scale.variables(1000)
    v["cluster"]["fabric"]["topology"][0]["nodes"] = "gpu[0001-0032],gpu2000"
    errors = validate(v["cluster"], v["groups"])
    assert [e.path for e in errors] == ["cluster.fabric.topology[].nodes"]
    assert "gpu2000" in errors[0].expected
