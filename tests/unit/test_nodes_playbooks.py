"""The node workflows (playbooks/add_nodes.yml, remove_nodes.yml; docs/nodes.md): their filters, that
add_nodes converges the same layers as site.yml in the same order, and that their refusals come before any
host changes (run for real against a throwaway inventory: no host is reachable, so anything past the plan
would fail on a connection, not on the refusal)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("lcm_nodes", REPO / "plugins/filter/lcm_nodes.py")
assert _spec and _spec.loader
nodes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(nodes)


def _imports(path: Path) -> list[str]:
    return [
        p["ansible.builtin.import_playbook"]
        for p in yaml.safe_load(path.read_text())
        if "ansible.builtin.import_playbook" in p
    ]


def test_node_list_takes_names_lists_and_hostlists() -> None:
    assert nodes.lcm_node_list("lab-node3") == ["lab-node3"]
    assert nodes.lcm_node_list("gpu[17-19],gpu23") == ["gpu17", "gpu18", "gpu19", "gpu23"]
    assert nodes.lcm_node_list(["gpu1", "gpu[2-3]", "gpu1"]) == ["gpu1", "gpu2", "gpu3"]
    assert nodes.lcm_node_list("") == [] and nodes.lcm_node_list(None) == []
    with pytest.raises(ValueError, match=r"nodes='gpu\[1-'"):
        nodes.lcm_node_list("gpu[1-")


def test_scontrol_node_line_keeps_the_reason_whole() -> None:
    line = (
        "NodeName=lab-node2 Arch=x86_64 CoresPerSocket=2 State=IDLE+DRAIN ThreadsPerCore=1 Partitions=batch "
        "Reason=lcm-burn-in: gemm 0.001 vs 0.002 [root@2026-12-01T18:36:40]"
    )
    fields = nodes.lcm_scontrol_node(line)
    assert fields["State"] == "IDLE+DRAIN" and fields["NodeName"] == "lab-node2"
    assert fields["Reason"] == "lcm-burn-in: gemm 0.001 vs 0.002 [root@2026-12-01T18:36:40]"


def test_burn_in_summaries_name_value_and_limit_or_the_reason() -> None:
    checks = [
        {"name": "gemm", "status": "fail", "value": 310.2, "threshold": 550.0},
        {"name": "gpu.row_remap_pending", "status": "fail", "value": "GPU 3: Yes", "expected": "No"},
        {"name": "gpu.count", "status": "fail", "value": None, "reason": "nvidia-smi not found on PATH"},
    ]
    got = [c["summary"] for c in nodes.lcm_burn_in_summaries(checks)]
    assert got == [
        "gemm 310.2 vs 550.0",
        "gpu.row_remap_pending GPU 3: Yes vs No",
        "gpu.count: nvidia-smi not found on PATH",
    ]


def test_add_nodes_converges_the_layers_of_site_yml_in_its_order() -> None:
    site = [
        p for p in _imports(REPO / "site.yml") if p not in ("playbooks/validate.yml", "playbooks/lab.yml")
    ]
    site = [Path(p).name for p in site if p != "playbooks/generation.yml"]
    add = _imports(REPO / "playbooks/add_nodes.yml")
    assert add[0] == "validate.yml" and "lab.yml" in add and add[-1] == "generation.yml"
    layers = [p for p in add if p not in ("validate.yml", "lab.yml", "generation.yml")]
    # every layer once, in site.yml's order, then slurm.yml again: the join
    assert layers == [*site, "slurm.yml"]


def test_every_layer_playbook_takes_the_target_group() -> None:
    for name in _imports(REPO / "site.yml"):
        if name in ("playbooks/validate.yml", "playbooks/lab.yml"):
            continue
        for play in yaml.safe_load((REPO / name).read_text()):
            assert play["hosts"].endswith(":&{{ lcm_target_group | default('all') }}"), (name, play["hosts"])


def _run(playbook: str, tmp_path: Path, extra: dict) -> subprocess.CompletedProcess[str]:
    inv = tmp_path / "inv"
    (inv / "group_vars/all").mkdir(parents=True)
    for f in ("cluster.yml",):
        (inv / "group_vars/all" / f).write_text((REPO / "inventories/lab/group_vars/all" / f).read_text())
    (inv / "group_vars/all/lock.yml").symlink_to(REPO / "versions.lock.yml")
    hosts = {
        "all": {
            "children": {
                "cluster": {
                    "children": {
                        "controller": {"hosts": {"ctl": {"ansible_host": "192.0.2.1"}}},
                        "monitoring": {"hosts": {"ctl": None}},
                        "compute": {
                            "hosts": {f"lab-node{i}": {"ansible_host": f"192.0.2.{i + 1}"} for i in (1, 2, 3)}
                        },
                    }
                }
            }
        }
    }
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_FORCE_COLOR="false")
    env["ANSIBLE_CACHE_PLUGIN_CONNECTION"] = str(tmp_path / "facts")
    ansible = Path(sys.executable).parent / "ansible-playbook"
    cmd = [str(ansible), "-i", str(inv), f"playbooks/{playbook}", "-e", json.dumps(extra)]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=180, check=False)


@pytest.mark.parametrize(
    ("playbook", "extra", "message"),
    [
        ("add_nodes.yml", {}, "-e nodes=<names> is required"),
        ("add_nodes.yml", {"nodes": "gpu99"}, "not compute hosts of this inventory: gpu99"),
        ("remove_nodes.yml", {}, "-e nodes=<names> is required"),
        ("remove_nodes.yml", {"nodes": "lab-node[1-3]"}, "that would remove every compute node"),
        ("remove_nodes.yml", {"nodes": "ctl"}, "not compute hosts of this inventory: ctl"),
    ],
)
def test_bad_node_requests_are_refused_before_any_host_changes(
    tmp_path: Path, playbook: str, extra: dict, message: str
) -> None:
    p = _run(playbook, tmp_path, extra)
    out = p.stdout + p.stderr
    assert p.returncode != 0
    assert message in out, out[-3000:]
    assert "UNREACHABLE" not in out  # it stopped at the plan, before contacting any node
