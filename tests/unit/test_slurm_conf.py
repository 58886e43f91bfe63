"""slurm role templates (slurm.conf, gres.conf, topology.conf, cgroup.conf) rendered by Ansible's engine,
and the filter that tells a restart-only slurm.conf change from a reconfigurable one."""

from __future__ import annotations

import copy
import importlib.util
from typing import Any

import pytest
import yaml
from _role_render import REPO, render

_spec = importlib.util.spec_from_file_location(
    "slurm_conf_filter", REPO / "roles/slurm/filter_plugins/slurm_conf.py"
)
assert _spec and _spec.loader
slurm_conf_filter = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(slurm_conf_filter)

LAB = yaml.safe_load((REPO / "inventories/lab/group_vars/all/cluster.yml").read_text())["cluster"]
RESTART_KEYS = yaml.safe_load((REPO / "roles/slurm/vars/main.yml").read_text())["_slurm_restart_keys"]


def _facts(
    host: str, cpus: int = 2, sockets: int = 1, cores: int = 2, tpc: int = 1, mem: int = 23000
) -> dict:
    return {
        "ansible_hostname": host,
        "ansible_processor_vcpus": cpus,
        "ansible_processor_count": sockets,
        "ansible_processor_cores": cores,
        "ansible_processor_threads_per_core": tpc,
        "ansible_memtotal_mb": mem,
    }


def _vars(cluster: dict, **extra: Any) -> dict:
    hosts = {"ctl": _facts("ctl"), "gpu01": _facts("gpu01", 224, 2, 56, 2, 2_000_000)}
    hosts["gpu02"] = _facts("gpu02", 224, 2, 56, 2, 2_000_000)
    base = {
        "cluster": cluster,
        "groups": {"controller": ["ctl"], "compute": ["gpu01", "gpu02"], "login": []},
        "hostvars": hosts,
        "inventory_hostname": "gpu01",
    }
    base.update(extra)
    return base


def _h200() -> dict:
    spec = copy.deepcopy(LAB)
    spec["name"] = "h200"
    spec["gpu"].update(model="h200", count_per_node=8, gres_type="h200")
    spec["slurm"].pop("proctrack_type")
    spec["slurm"].pop("task_plugin")
    spec["slurm"].pop("node_slots")
    return spec


def _conf(text: str) -> dict[str, list[str]]:
    return slurm_conf_filter.slurm_conf_entries(text)


def test_lab_spec_renders_lab_overrides() -> None:
    conf = _conf(render("slurm", "slurm.conf.j2", _vars(LAB)))
    assert conf["clustername"] == ["ClusterName=lab"]
    assert conf["slurmctldhost"] == ["SlurmctldHost=ctl"]
    assert conf["proctracktype"] == ["ProctrackType=proctrack/cgroup"]
    assert conf["taskplugin"] == ["TaskPlugin=task/cgroup"]  # not the default task/affinity,task/cgroup
    assert conf["selecttype"] == ["SelectType=select/cons_tres"]
    assert conf["jobrequeue"] == ["JobRequeue=1"]
    assert conf["tcptimeout"] == ["TCPTimeout=2"]  # Slurm's default unless the inventory says otherwise
    assert "grestypes" not in conf
    assert "topologyplugin" not in conf
    assert conf["partitionname"] == [
        "PartitionName=batch Nodes=gpu[01-02] Default=YES MaxTime=2:00:00 State=UP"
    ]


def test_production_defaults_and_gpu_nodes() -> None:
    conf = _conf(render("slurm", "slurm.conf.j2", _vars(_h200())))
    assert conf["proctracktype"] == ["ProctrackType=proctrack/cgroup"]
    assert conf["taskplugin"] == ["TaskPlugin=task/affinity,task/cgroup"]  # the schema's default
    assert conf["grestypes"] == ["GresTypes=gpu"]
    assert conf["nodename"] == [  # alike nodes: one line, a hostlist range
        "NodeName=gpu[01-02] CPUs=224 Sockets=2 CoresPerSocket=56 ThreadsPerCore=2 "
        f"RealMemory={2_000_000 - 2048} Gres=gpu:h200:8 State=UNKNOWN"
    ]


def test_node_addresses_where_hosts_give_one() -> None:
    v = _vars(_h200(), slurm_node_slots="gpu[01-04]")
    v["hostvars"]["gpu01"]["slurm_node_addr"] = "10.0.0.1"
    v["hostvars"]["gpu02"]["slurm_node_addr"] = "10.0.0.2"
    v["hostvars"]["gpu03"] = {**_facts("gpu03", 224, 2, 56, 2, 2_000_000), "slurm_node_addr": "10.0.0.3"}
    v["groups"]["compute"].append("gpu03")
    v["slurm_joining_nodes"] = ["gpu03"]  # joining: a FUTURE line, with its address already
    hw = "CPUs=224 Sockets=2 CoresPerSocket=56 ThreadsPerCore=2 "
    hw += f"RealMemory={2_000_000 - 2048} Gres=gpu:h200:8"
    assert _conf(render("slurm", "slurm.conf.j2", v))["nodename"] == [
        f"NodeName=gpu01 NodeAddr=10.0.0.1 {hw} State=UNKNOWN",
        f"NodeName=gpu02 NodeAddr=10.0.0.2 {hw} State=UNKNOWN",
        f"NodeName=gpu03 NodeAddr=10.0.0.3 {hw} State=FUTURE",
        f"NodeName=gpu04 {hw} State=FUTURE",  # a free slot: no host, no address
    ]
    assert _conf(render("slurm", "slurm.conf.j2", v))["slurmctldhost"] == ["SlurmctldHost=ctl"]
    v["hostvars"]["ctl"]["slurm_node_addr"] = "10.0.0.100"  # the controller: name(addr)
    assert _conf(render("slurm", "slurm.conf.j2", v))["slurmctldhost"] == ["SlurmctldHost=ctl(10.0.0.100)"]
    v["hostvars"]["gpu02"]["slurm_node_addr"] = ""  # "" (the role default): the name is resolved
    nodes = _conf(render("slurm", "slurm.conf.j2", v))["nodename"]
    assert f"NodeName=gpu02 {hw} State=UNKNOWN" in nodes


def test_realmemory_reserve_is_configurable() -> None:
    conf = _conf(render("slurm", "slurm.conf.j2", _vars(LAB, slurm_realmemory_reserve_mb=10_000)))
    assert f"RealMemory={2_000_000 - 10_000}" in conf["nodename"][0]


def test_gres_conf_static_without_nvml() -> None:
    text = render("slurm", "gres.conf.j2", _vars(_h200(), _slurm_has_nvml=False))
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert lines == ["Name=gpu Type=h200 File=/dev/nvidia[0-7]"]


def test_gres_conf_autodetect_with_nvml() -> None:
    text = render("slurm", "gres.conf.j2", _vars(_h200(), _slurm_has_nvml=True))
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert lines[0] == "AutoDetect=nvml"
    assert lines[1] == "Name=gpu Type=h200 Count=8"


def test_gres_conf_empty_without_gpus() -> None:
    text = render("slurm", "gres.conf.j2", _vars(LAB))
    assert [line for line in text.splitlines() if line and not line.startswith("#")] == []


def test_topology_from_fabric_spec() -> None:
    spec = _h200()
    spec["fabric"]["topology"] = [
        {"switch": "leaf1", "nodes": "gpu[01-02]"},
        {"switch": "spine", "switches": "leaf1", "link_speed": 400},
    ]
    conf = _conf(render("slurm", "slurm.conf.j2", _vars(spec)))
    assert conf["topologyplugin"] == ["TopologyPlugin=topology/tree"]
    topo = render("slurm", "topology.conf.j2", _vars(spec))
    lines = [line for line in topo.splitlines() if line and not line.startswith("#")]
    assert lines == ["SwitchName=leaf1 Nodes=gpu[01-02]", "SwitchName=spine Switches=leaf1 LinkSpeed=400"]


def test_cgroup_conf_constrains_devices_only_with_gpus() -> None:
    assert "ConstrainDevices=yes" in render("slurm", "cgroup.conf.j2", _vars(_h200()))
    assert "ConstrainDevices=no" in render("slurm", "cgroup.conf.j2", _vars(LAB))


def test_partition_groups_and_several_partitions() -> None:
    spec = copy.deepcopy(LAB)
    spec["slurm"]["partitions"] = [
        {"name": "batch", "groups": ["compute"], "default": True, "max_time": "2:00:00"},
        {"name": "debug", "groups": ["debugnodes", "compute"]},
    ]
    variables = _vars(spec)
    variables["groups"]["debugnodes"] = ["gpu02"]
    conf = _conf(render("slurm", "slurm.conf.j2", variables))
    assert (
        conf["partitionname"][1]
        == "PartitionName=debug Nodes=gpu[01-02] Default=NO MaxTime=UNLIMITED State=UP"  # each node once
    )


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (("MaxTime=2:00:00", "MaxTime=4:00:00"), []),
        (("KillWait=30", "KillWait=60"), []),
        (("ProctrackType=proctrack/cgroup", "ProctrackType=proctrack/linuxproc"), ["ProctrackType"]),
        (("RealMemory=20952", "RealMemory=20000"), ["NodeName"]),
        (("SlurmdPort=6818", "SlurmdPort=7818"), ["SlurmdPort"]),
        (("# Partitions", "#   partitions, reworded"), []),
    ],
)
def test_restart_needed_only_for_restart_keys(change: tuple[str, str], expected: list[str]) -> None:
    lab_facts = {h: _facts(h) for h in ("ctl", "gpu01", "gpu02")}
    old = render("slurm", "slurm.conf.j2", _vars(LAB, hostvars=lab_facts))
    assert change[0] in old
    new = old.replace(change[0], change[1])
    assert slurm_conf_filter.slurm_restart_keys_changed(old, new, RESTART_KEYS) == expected


def test_first_install_counts_as_restart() -> None:
    new = render("slurm", "slurm.conf.j2", _vars(LAB))
    changed = slurm_conf_filter.slurm_restart_keys_changed("", new, RESTART_KEYS)
    assert {"ClusterName", "SlurmctldHost", "NodeName", "ProctrackType"} <= set(changed)


def test_entries_join_continuations_and_ignore_case_and_spacing() -> None:
    a = "nodename=a  CPUs=2 \\\n  RealMemory=10\n"
    b = "NodeName=a CPUs=2 RealMemory=10 # same node\n"
    assert slurm_conf_filter.slurm_restart_keys_changed(a, b, ["NodeName"]) == ["NodeName"]  # value case kept
    c = "NodeName=a CPUs=2 \\\n RealMemory=10\n"
    assert slurm_conf_filter.slurm_restart_keys_changed(c, b, ["NodeName"]) == []


def test_node_watchdog_conf_and_unit() -> None:
    conf = render("slurm", "lcm-node-watchdog.conf.j2", _vars(LAB))
    assert "LCM_WD_INTERVAL_S=10\n" in conf and "LCM_WD_HOLDDOWN_S=60\n" in conf
    assert "LCM_WD_HEALTHCHECK=/etc/slurm/lcm-healthcheck.sh\n" in conf
    lab = render(
        "slurm",
        "lcm-node-watchdog.conf.j2",
        _vars(LAB, slurm_node_watchdog_interval_s=3, slurm_node_watchdog_holddown_s=20),
    )
    assert "LCM_WD_INTERVAL_S=3\n" in lab and "LCM_WD_HOLDDOWN_S=20\n" in lab
    unit = render("slurm", "lcm-node-watchdog.service.j2", _vars(LAB))
    assert "ExecStart=/etc/slurm/lcm-node-watchdog.sh /etc/slurm/lcm-node-watchdog.conf" in unit
    assert "Restart=always" in unit and "WantedBy=multi-user.target" in unit


def test_node_watchdog_runs_on_compute_nodes_only() -> None:
    from _role_render import evaluate

    assert evaluate("slurm", "_slurm_watchdog_wanted | bool", _vars(LAB)) is True
    assert evaluate("slurm", "_slurm_watchdog_wanted | bool", _vars(LAB, inventory_hostname="ctl")) is False
    off = _vars(LAB, slurm_node_watchdog_enabled=False)
    assert evaluate("slurm", "_slurm_watchdog_wanted | bool", off) is False


def test_daemons_bind_the_cluster_interface_unless_the_spec_says_otherwise() -> None:
    conf = _conf(render("slurm", "slurm.conf.j2", _vars(LAB)))
    assert conf["communicationparameters"] == ["CommunicationParameters=NoInAddrAny,NoCtldInAddrAny"]
    spec = copy.deepcopy(LAB)
    spec["slurm"]["bind_any_address"] = True
    assert "communicationparameters" not in _conf(render("slurm", "slurm.conf.j2", _vars(spec)))
    old = render("slurm", "slurm.conf.j2", _vars(spec))
    new = render("slurm", "slurm.conf.j2", _vars(LAB))
    # a listening change needs the daemons restarted, not scontrol reconfigure
    assert slurm_conf_filter.slurm_restart_keys_changed(old, new, RESTART_KEYS) == ["CommunicationParameters"]


def _nodes(text: str) -> dict[str, str]:
    """Node name -> its line as if it had its own (NodeName=<range> lines expanded)."""
    out = {}
    for line in _conf(text).get("nodename", []):
        expr, rest = line.split(None, 1)
        for name in slurm_conf_filter.slurm_hostlist_expand(expr.split("=", 1)[1]):
            out[name] = f"NodeName={name} {rest}"
    return out


def _partition_nodes(text: str) -> list[str]:
    line = _conf(text)["partitionname"][0]
    expr = next(w for w in line.split() if w.startswith("Nodes=")).removeprefix("Nodes=")
    return slurm_conf_filter.slurm_hostlist_expand(expr)


def _slots(spec: dict, slots: str) -> dict:
    spec = copy.deepcopy(spec)
    spec["slurm"]["node_slots"] = slots
    return spec


def test_free_slots_are_future_lines_with_the_reference_hardware() -> None:
    text = render("slurm", "slurm.conf.j2", _vars(_slots(_h200(), "gpu[01-04]")))
    nodes = _nodes(text)
    assert sorted(nodes) == ["gpu01", "gpu02", "gpu03", "gpu04"]
    assert nodes["gpu01"].endswith("State=UNKNOWN") and nodes["gpu02"].endswith("State=UNKNOWN")
    hw = nodes["gpu01"].removeprefix("NodeName=gpu01 ").removesuffix(" State=UNKNOWN")
    assert nodes["gpu03"] == f"NodeName=gpu03 {hw} State=FUTURE"
    assert _partition_nodes(text) == ["gpu01", "gpu02"]


def test_joining_and_leaving_hosts_are_future_and_in_no_partition() -> None:
    spec = _slots(_h200(), "gpu[01-04]")
    joining = render("slurm", "slurm.conf.j2", _vars(spec, slurm_joining_nodes=["gpu02"]))
    assert _nodes(joining)["gpu02"].endswith("State=FUTURE")
    assert _partition_nodes(joining) == ["gpu01"]
    leaving = render("slurm", "slurm.conf.j2", _vars(spec, slurm_leaving_nodes=["gpu02"]))
    assert _nodes(leaving)["gpu02"].endswith("State=FUTURE") and _partition_nodes(leaving) == ["gpu01"]
    # a host outside the slots still gets a FUTURE line while it joins: the node table does not change
    outside = render("slurm", "slurm.conf.j2", _vars(_h200(), slurm_joining_nodes=["gpu02"]))
    assert sorted(_nodes(outside)) == ["gpu01", "gpu02"]


def test_a_failed_burn_in_is_no_drain_line_in_slurm_conf() -> None:
    """The node is drained by scontrol before its slurmd starts (tasks/run.yml), not by a State=DRAIN line:
    Slurm re-applies such a line at every later reconfigure (seen on 22.05: a resumed node drained again)."""
    reasons = {"gpu02": "lcm-burn-in: gemm_tflops 310.2 vs 550"}
    text = render("slurm", "slurm.conf.j2", _vars(_slots(_h200(), "gpu[01-04]"), slurm_node_reasons=reasons))
    assert _nodes(text)["gpu02"].endswith("State=UNKNOWN")
    assert "DRAIN" not in text and "gpu02" in _partition_nodes(text)


@pytest.mark.parametrize(
    ("before", "after", "restart"),
    [
        # join: a slot becomes a node, enters drained, leaves again: scontrol reconfigure
        ({}, {"slurm_joining_nodes": ["gpu02"]}, []),
        ({"slurm_joining_nodes": ["gpu02"]}, {}, []),
        ({}, {"slurm_leaving_nodes": ["gpu02"]}, []),
    ],
)
def test_joining_or_leaving_a_slot_is_a_reconfigure(before: dict, after: dict, restart: list[str]) -> None:
    spec = _slots(_h200(), "gpu[01-04]")
    old = render("slurm", "slurm.conf.j2", _vars(spec, **before))
    new = render("slurm", "slurm.conf.j2", _vars(spec, **after))
    assert old != new
    assert slurm_conf_filter.slurm_restart_keys_changed(old, new, RESTART_KEYS) == restart


def test_node_addresses_join_and_leave_by_reconfigure_and_a_moved_one_restarts() -> None:
    spec = _slots(_h200(), "gpu[01-04]")

    def conf(addr: dict[str, str], **extra: Any) -> str:
        v = _vars(spec, **extra)
        v["hostvars"]["gpu03"] = _facts("gpu03", 224, 2, 56, 2, 2_000_000)
        for host, a in addr.items():
            v["hostvars"][host]["slurm_node_addr"] = a
        if "gpu03" in addr:
            v["groups"]["compute"].append("gpu03")
        return render("slurm", "slurm.conf.j2", v)

    two = {"gpu01": "10.0.0.1", "gpu02": "10.0.0.2"}
    three = {**two, "gpu03": "10.0.0.3"}
    free = conf(two)  # gpu03 a free slot: FUTURE, no address
    joining = conf(three, slurm_joining_nodes=["gpu03"])  # FUTURE with its address
    joined = conf(three)  # in service
    assert "NodeName=gpu03 NodeAddr=10.0.0.3" in joining and "NodeAddr=10.0.0.3" not in free
    for old, new in [(free, joining), (joining, joined), (joined, joining), (joining, free)]:
        assert slurm_conf_filter.slurm_restart_keys_changed(old, new, RESTART_KEYS) == []
    moved = conf({**three, "gpu02": "10.0.0.22"})
    assert slurm_conf_filter.slurm_restart_keys_changed(joined, moved, RESTART_KEYS) == ["NodeName"]
    unaddressed = conf({**three, "gpu02": ""})
    assert slurm_conf_filter.slurm_restart_keys_changed(joined, unaddressed, RESTART_KEYS) == ["NodeName"]


def test_a_name_outside_the_slots_changes_the_node_table_and_needs_a_restart() -> None:
    one = {"controller": ["ctl"], "compute": ["gpu01"]}
    two = render("slurm", "slurm.conf.j2", _vars(_h200(), groups=one))
    three = render("slurm", "slurm.conf.j2", _vars(_h200()))
    assert slurm_conf_filter.slurm_restart_keys_changed(two, three, RESTART_KEYS) == ["NodeName"]
    # the same growth inside the slots is a reconfigure
    spec = _slots(_h200(), "gpu[01-04]")
    two = render("slurm", "slurm.conf.j2", _vars(spec, groups=one))
    three = render("slurm", "slurm.conf.j2", _vars(spec))
    assert slurm_conf_filter.slurm_restart_keys_changed(two, three, RESTART_KEYS) == []


def test_hostlist_filter() -> None:
    assert slurm_conf_filter.slurm_hostlist_expand("") == []
    assert slurm_conf_filter.slurm_hostlist_expand("lab-node[1-3]") == ["lab-node1", "lab-node2", "lab-node3"]


def test_a_thousand_alike_nodes_are_one_line_and_the_table_is_unchanged_by_ranges() -> None:
    """1,000 x 8-GPU nodes: one NodeName line and one partition range; a node with other hardware gets its
    own line; the node table (what decides restart vs reconfigure) is per node whatever the grouping."""
    names = [f"gpu{i:04d}" for i in range(1, 1001)]
    hosts = {"ctl": _facts("ctl")} | {n: _facts(n, 224, 2, 56, 2, 2_000_000) for n in names}
    hosts["gpu0500"] = _facts("gpu0500", 224, 2, 56, 2, 1_500_000)  # less memory: a line of its own
    variables = _vars(
        _slots(_h200(), "gpu[0001-1024]"),
        groups={"controller": ["ctl"], "compute": names, "login": []},
        hostvars=hosts,
    )
    text = render("slurm", "slurm.conf.j2", variables)
    lines = _conf(text)["nodename"]
    mem = f"RealMemory={2_000_000 - 2048}"
    assert [ln.split()[0] for ln in lines] == [
        "NodeName=gpu[0001-0499,0501-1000]",
        "NodeName=gpu0500",
        "NodeName=gpu[1001-1024]",  # the free slots: FUTURE with the reference host's hardware
    ]
    assert mem in lines[0] and lines[0].endswith("State=UNKNOWN") and lines[2].endswith("State=FUTURE")
    assert f"RealMemory={1_500_000 - 2048}" in lines[1]
    assert _partition_nodes(text) == names
    assert len(text.splitlines()) < 80
    per_node = slurm_conf_filter.node_table(lines)
    assert len(per_node) == 1024 and per_node[0].startswith("NodeName=gpu0001 CPUs=224")
    # gpu1001 joins: a range changes, the node table does not -> a reconfigure, no restart
    joined = render(
        "slurm",
        "slurm.conf.j2",
        {**variables, "groups": {**variables["groups"], "compute": [*names, "gpu1001"]},
         "hostvars": {**hosts, "gpu1001": _facts("gpu1001", 224, 2, 56, 2, 2_000_000)}},
    )  # fmt: skip
    assert "NodeName=gpu[0001-0499,0501-1001] " in joined
    assert slurm_conf_filter.slurm_restart_keys_changed(text, joined, RESTART_KEYS) == []
