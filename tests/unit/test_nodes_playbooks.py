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
        p
        for p in _imports(REPO / "site.yml")
        if p not in ("playbooks/validate.yml", "playbooks/lab.yml", "playbooks/unchanged.yml")
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
            # then site.yml's unchanged check may leave out lcm_unchanged (test_converge_unchanged.py)
            pattern = play["hosts"].removesuffix(
                "{{ ':!lcm_unchanged' if 'lcm_unchanged' in groups else '' }}"
            )
            assert pattern.endswith(":&{{ lcm_target_group | default('all') }}"), (name, play["hosts"])


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
        ("rolling.yml", {"rolling_extra_vars": "gemm=1000"}, "rolling_extra_vars must be a mapping"),
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


# The cross-node sweep of add_nodes' burn-in (playbooks/tasks/burn_in_cluster.yml, docs/nodes.md).


def test_sinfo_states_per_node() -> None:
    text = "lab-node1|mixed\nlab-node2|IDLE\nlab-node4|idle*\n\nbad line\n"
    assert nodes.lcm_sinfo_states(text) == {"lab-node1": "mixed", "lab-node2": "idle", "lab-node4": "idle*"}
    assert nodes.lcm_sinfo_states(None) == {}


@pytest.mark.parametrize(
    ("passed", "states", "policy", "gpus", "want_nodes", "why"),
    [
        # >= 2 new nodes: they alone, in order, whatever the others do
        (["n3", "n4"], {"n1": "idle"}, "auto", 8, ["n3", "n4"], "2 new nodes"),
        (["n3", "n4"], {}, "none", 0, ["n3", "n4"], "2 new nodes"),
        ([], {"n1": "idle"}, "auto", 0, [], "no new node passed"),
        # one new node: an idle node in service first (n2 idle although n1 comes first)
        (["n3"], {"n1": "mixed", "n2": "idle"}, "auto", 8, ["n3", "n2"], "with n2 (idle"),
        (
            ["n3"],
            {"n1": "allocated", "n2": "mixed"},
            "auto",
            0,
            ["n3", "n1"],
            "running jobs",
        ),  # CPU: a busy one
        (["n3"], {"n1": "allocated", "n2": "mixed"}, "auto", 8, [], "busy ones have GPUs"),  # GPU: never busy
        (["n3"], {"n1": "allocated"}, "any", 8, ["n3", "n1"], "running jobs"),
        (["n3"], {"n1": "allocated"}, "idle", 0, [], "no idle compute node"),
        (["n3"], {"n1": "idle"}, "none", 0, [], "burn_in_cluster_partner=none"),
        # drained, down, not responding, FUTURE: never a partner
        (["n3"], {"n1": "drained", "n2": "idle*"}, "any", 0, [], "no other compute node in service"),
        (["n3"], {"n1": "down", "n2": "future"}, "auto", 0, [], "no other compute node in service"),
        # no Slurm: every other compute node counts as idle
        (["n3"], None, "auto", 8, ["n3", "n1"], "with n1 (idle"),
    ],
)
def test_sweep_plan_chooses_the_nodes(
    passed: list[str], states: dict | None, policy: str, gpus: int, want_nodes: list[str], why: str
) -> None:
    plan = nodes.lcm_sweep_plan(passed, ["n1", "n2", "n3", "n4"], states, policy, gpus)
    assert plan["nodes"] == want_nodes and why in plan["why"], plan
    assert plan["partner"] == (want_nodes[1] if len(passed) == 1 and want_nodes else None)


def test_sweep_plan_refuses_an_unknown_policy() -> None:
    with pytest.raises(ValueError, match="burn_in_cluster_partner='busy'"):
        nodes.lcm_sweep_plan(["n3"], ["n1"], {}, "busy")


def _cluster_report(status: str, value: float | None, threshold: float, reason: str = "") -> dict:
    check = {
        "name": "allreduce",
        "scope": "cluster",
        "status": status,
        "value": value,
        "threshold": threshold,
    }
    return {"checks": [{**check, "reason": reason, "unit": "GB/s"}]}


def test_sweep_verdict_passes_fails_below_the_floor_and_names_a_failed_step() -> None:
    ok = nodes.lcm_sweep_verdict(_cluster_report("pass", 0.25, 0.005), ["n3", "n1"])
    assert ok == {"ok": True, "reason": "", "busbw": 0.25}
    low = nodes.lcm_sweep_verdict(_cluster_report("fail", 0.001, 0.005), ["n3", "n1"])
    assert (
        low["ok"] is False
        and low["reason"] == "lcm-burn-in: cross-node allreduce (n3+n1): allreduce 0.001 vs 0.005"
    )
    broken = _cluster_report("fail", None, 0.005, "the all-reduce failed: Timed out waiting for the store")
    got = nodes.lcm_sweep_verdict(broken, ["n3", "n4"])
    assert got["reason"].endswith("allreduce: the all-reduce failed: Timed out waiting for the store")
    step = nodes.lcm_sweep_verdict(None, ["n3", "n4"], "Start the all-reduce: unreachable")
    assert (
        step["ok"] is False
        and step["reason"] == "lcm-burn-in: cross-node allreduce (n3+n4): Start the all-reduce: unreachable"
    )
    # a one-node report is not the cross-node sweep; no allreduce at all is no verdict
    one = _cluster_report("pass", 3.0, 0.005)
    one["checks"][0]["scope"] = "node"
    assert not nodes.lcm_sweep_verdict(one, ["n3", "n4"])["ok"]
    assert not nodes.lcm_sweep_verdict({"checks": []}, ["n3", "n4"])["ok"]
    assert len(nodes.lcm_sweep_verdict(None, ["n3"], "x" * 500)["reason"]) == 200  # a Slurm drain reason


def _sweep_run(
    tmp_path: Path, hosts: list[str], cluster_floor: float, limit: str | None = None, timeout_s: int = 60
) -> tuple[subprocess.CompletedProcess[str], dict[str, dict]]:
    """playbooks/tasks/burn_in_cluster.yml for real: every host a local 'node' (connection local), the real
    lcm-runner of this venv, a gloo sweep meeting at 127.0.0.1. Returns the run and each host's verdict."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    expect = tmp_path / "expect.json"
    probes = {"busbw_node_gbps": 0.0, "busbw_cluster_gbps": cluster_floor}
    expect.write_text(
        json.dumps({"schema": 1, "node": "n", "gpu": {"model": "none", "count": 0}, "probes": probes})
    )
    host_vars = {
        h: {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "burn_in_report_dir": str(tmp_path / h),
            **({"_burn_in_ok": True} if i == 0 else {}),  # the first is "being added", the other a partner
        }
        for i, h in enumerate(hosts)
    }
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump({"all": {"children": {"sweep": {"hosts": host_vars}}}}))
    verdict = "{{ {'ok': _sweep_ok, 'reason': _sweep_reason, 'busbw': _sweep_busbw, 'burn_in_ok': _burn_in_ok | default(None), 'burn_in_reason': _burn_in_reason | default(None)} | to_json }}"  # noqa: E501
    play = [
        {
            "hosts": "sweep",
            "gather_facts": False,
            "vars": {
                "burn_in_sweep_nodes": hosts,
                "burn_in_sweep_master": "127.0.0.1",
                "burn_in_lcm_runner": str(Path(sys.executable).parent / "lcm-runner"),
                "burn_in_expect_file": str(expect),
                "burn_in_cluster_timeout_s": timeout_s,
            },
            "tasks": [
                {"ansible.builtin.include_tasks": str(REPO / "playbooks/tasks/burn_in_cluster.yml")},
                {
                    "ansible.builtin.copy": {
                        "content": verdict,
                        "dest": str(tmp_path / "{{ inventory_hostname }}.verdict.json"),
                        "mode": "0644",
                    }
                },
            ],
        }
    ]
    pb = tmp_path / "sweep.yml"
    pb.write_text(yaml.safe_dump(play, sort_keys=False))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_FORCE_COLOR="false")
    env = {k: v for k, v in env.items() if not k.startswith(("LCM_PROBE_", "SLURM_"))}
    # One fork: Ansible runs a task on one host at a time, so only a start that does not wait (async, poll 0)
    # lets the nodes meet.
    env.update(
        ANSIBLE_FORKS="1", CUDA_VISIBLE_DEVICES="", ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts")
    )
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inv), str(pb)]
    if limit:
        cmd += ["--limit", limit]
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    got = {
        h: json.loads((tmp_path / f"{h}.verdict.json").read_text())
        for h in hosts
        if (tmp_path / f"{h}.verdict.json").exists()
    }
    return p, got


def test_burn_in_cluster_tasks_run_the_sweep_on_every_node_at_once(tmp_path: Path) -> None:
    # Sequential starts could not pass (one fork, _sweep_run): rank 0 would wait alone at the master until
    # --timeout and fail.
    p, got = _sweep_run(tmp_path, ["n3", "n1"], cluster_floor=0.0001)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    assert got["n3"]["ok"] is True and got["n1"]["ok"] is True, got
    assert got["n3"]["burn_in_ok"] is True and got["n1"]["burn_in_ok"] is None  # the partner is not judged
    for host, rank in (("n3", 0), ("n1", 1)):
        report = json.loads((tmp_path / host / "burn-in-cluster.json").read_text())
        check = next(c for c in report["checks"] if c["name"] == "allreduce")
        assert check["scope"] == "cluster" and check["status"] == "pass", check
        assert check["details"]["ranks"] == 2 and check["details"]["node_rank"] == rank
        assert check["threshold"] == 0.0001 and check["value"] == got[host]["busbw"] > 0.0001
        assert report["options"]["master"].startswith("127.0.0.1:")


def test_burn_in_cluster_fails_below_the_floor_and_when_a_node_never_comes(tmp_path: Path) -> None:
    p, got = _sweep_run(tmp_path / "floor", ["n3", "n1"], cluster_floor=1e6)
    assert p.returncode == 0, p.stdout[-4000:]  # never fails the play: the verdict does
    assert got["n3"]["burn_in_ok"] is False and got["n1"]["ok"] is False
    assert got["n3"]["burn_in_reason"].startswith("lcm-burn-in: cross-node allreduce (n3+n1): allreduce ")
    assert got["n3"]["burn_in_reason"].endswith(" vs 1000000.0")
    # n1 never starts (--limit n3): n3 waits at the master for --timeout, then fails, naming the failure
    p, got = _sweep_run(tmp_path / "alone", ["n3", "n1"], cluster_floor=0.0, limit="n3", timeout_s=5)
    assert p.returncode == 0, p.stdout[-4000:]
    assert got["n3"]["burn_in_ok"] is False, got
    assert got["n3"]["burn_in_reason"].startswith(
        "lcm-burn-in: cross-node allreduce (n3+n1): allreduce: the all-reduce failed"
    ), got
