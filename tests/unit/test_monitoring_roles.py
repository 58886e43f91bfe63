"""The monitoring layer's server-side templates (roles node_exporter, prometheus, alertmanager,
slurm_metrics) rendered by Ansible's own engine for the lab spec and a production-like GPU spec, then
checked by the real tools: `promtool check config` on the generated scrape configuration (with the real
rule files rendered beside it), `amtool check-config` on every receiver kind. Plus the spec rules of
cluster.monitoring and the listen-address logic (never every address unless asked)."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path

import pytest
import yaml
from _role_render import REPO, evaluate, render

from lcm_runner.lock import release_lock
from lcm_runner.spec import rules
from lcm_runner.spec.errors import SpecError

TOOLS = REPO / ".cache" / "tools" / "bin"
LAB = yaml.safe_load((REPO / "inventories/lab/group_vars/all/cluster.yml").read_text())["cluster"]
H200 = yaml.safe_load((REPO / "inventories/example-h200/group_vars/all/cluster.yml").read_text())["cluster"]
LOCK = release_lock(yaml.safe_load((REPO / "versions.lock.yml").read_text())["lcm_lock"])


def _tool(name: str) -> str:
    path = TOOLS / name
    if not path.exists():
        pytest.fail(f"{path} is missing: run scripts/bootstrap (it unpacks promtool and amtool)")
    return str(path)


def _groups(gpu: bool) -> dict[str, list[str]]:
    compute = ["gpu01", "gpu02", "gpu03"] if gpu else ["lab-node1", "lab-node2"]
    ctl = ["head01"] if gpu else ["lab-ctl"]
    return {
        "all": ctl + compute,
        "cluster": ctl + compute,
        "controller": ctl,
        "compute": compute,
        "monitoring": ctl,
        "login": [],
    }


def _vars(spec: dict, gpu: bool = False, **extra: object) -> dict:
    groups = _groups(gpu)
    return {
        "cluster": copy.deepcopy(spec),
        "groups": groups,
        "inventory_hostname": groups["monitoring"][0],
        "_monitoring_listen_address": "10.0.0.10",
        "lcm_lock": LOCK,
        **extra,
    }


def _rendered_prometheus(tmp_path: Path, spec: dict, gpu: bool) -> Path:
    """prometheus.yml and the two rule files in tmp_path, the config pointing at them there."""
    variables = _vars(spec, gpu, _prometheus_rules_dir=str(tmp_path / "rules"))
    (tmp_path / "rules").mkdir()
    for name in evaluate("prometheus", "_prometheus_rule_templates", variables):
        (tmp_path / "rules" / name).write_text(render("prometheus", f"{name}.j2", variables))
    config = tmp_path / "prometheus.yml"
    config.write_text(render("prometheus", "prometheus.yml.j2", variables))
    return config


@pytest.mark.parametrize(("spec", "gpu"), [(LAB, False), (H200, True)], ids=["lab", "h200"])
def test_scrape_config_is_generated_from_the_inventory_and_promtool_accepts_it(
    tmp_path: Path, spec: dict, gpu: bool
) -> None:
    config = _rendered_prometheus(tmp_path, spec, gpu)
    p = subprocess.run([_tool("promtool"), "check", "config", str(config)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    doc = yaml.safe_load(config.read_text())
    jobs = {j["job_name"]: j for j in doc["scrape_configs"]}
    groups = _groups(gpu)

    def targets(job: str) -> dict[str, str]:
        return {sc["targets"][0]: sc["labels"]["node"] for sc in jobs[job]["static_configs"]}

    assert targets("node") == {f"{h}:9100": h for h in groups["cluster"]}
    assert targets("prometheus") == {f"{h}:9090": h for h in groups["monitoring"]}
    assert targets("alertmanager") == {f"{h}:9093": h for h in groups["monitoring"]}
    if gpu:
        assert targets("dcgm") == {f"{h}:9400": h for h in groups["compute"]}
    else:
        assert "dcgm" not in jobs
    interval = f"{spec.get('monitoring', {}).get('scrape_interval_s', 15)}s"
    assert doc["global"]["scrape_interval"] == interval
    assert doc["global"]["external_labels"] == {"cluster": spec["name"]}
    am = doc["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"]
    assert am == [f"{h}:9093" for h in groups["monitoring"]]


def test_extra_scrape_configs_are_appended_and_checked(tmp_path: Path) -> None:
    extra = [{"job_name": "storage", "static_configs": [{"targets": ["nas01:9100"]}]}]
    variables = _vars(LAB, prometheus_extra_scrape_configs=extra, _prometheus_rules_dir=str(tmp_path))
    for name in evaluate("prometheus", "_prometheus_rule_templates", variables):
        (tmp_path / name).write_text(render("prometheus", f"{name}.j2", variables))
    config = tmp_path / "prometheus.yml"
    config.write_text(render("prometheus", "prometheus.yml.j2", variables))
    p = subprocess.run([_tool("promtool"), "check", "config", str(config)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    assert yaml.safe_load(config.read_text())["scrape_configs"][-1] == extra[0]


def test_promtool_rejects_a_broken_generated_config(tmp_path: Path) -> None:
    """The validate step can fail: a config naming a rule file that does not parse is refused."""
    config = _rendered_prometheus(tmp_path, LAB, False)
    (tmp_path / "rules" / "lcm_alerts.rules.yml").write_text(
        "groups:\n  - name: x\n    rules:\n      - alert: A\n"
    )
    p = subprocess.run([_tool("promtool"), "check", "config", str(config)], capture_output=True, text=True)
    assert p.returncode != 0


def _args(role: str, template: str, variables: dict) -> list[str]:
    text = render(role, template, variables)
    line = next(ln for ln in text.splitlines() if ln.startswith("ARGS="))
    return line.removeprefix('ARGS="').removesuffix('"').split()


def test_every_service_listens_on_the_given_address_only() -> None:
    v = _vars(LAB)
    node = _args("node_exporter", "node_exporter.default.j2", v)
    assert "--web.listen-address=10.0.0.10:9100" in node
    assert "--collector.textfile.directory=/var/lib/prometheus/node-exporter" in node  # the schema default
    prom = _args("prometheus", "prometheus.default.j2", v)
    assert "--web.listen-address=10.0.0.10:9090" in prom
    assert "--storage.tsdb.retention.time=2d" in prom  # the lab spec's retention_days
    am = _args("alertmanager", "alertmanager.default.j2", v)
    assert "--web.listen-address=10.0.0.10:9093" in am
    assert "--cluster.listen-address=" in am  # empty: no HA gossip listener (default :9094, every address)
    assert not any("0.0.0.0" in a for a in node + prom + am)


def test_node_exporter_collectors_and_the_old_release_flag() -> None:
    v = _vars(LAB, node_exporter_collectors_enabled=["systemd"], node_exporter_collectors_disabled=["zfs"])
    args = _args("node_exporter", "node_exporter.default.j2", v)
    assert "--collector.systemd" in args and "--no-collector.zfs" in args
    assert "--collector.mountstats" not in args  # the lab's storage is not NFS
    nfs = copy.deepcopy(LAB)
    nfs["storage"].update(type="nfs", nfs={"export_path": "/srv/lcm"})
    with_nfs = _args("node_exporter", "node_exporter.default.j2", {**v, "cluster": nfs})
    assert "--collector.mountstats" in with_nfs
    assert any(a.startswith("--collector.filesystem.mount-points-exclude=") for a in args)
    # The locked release tarball (1.0.1) predates the flag's rename in 1.1.
    old = _args(
        "node_exporter", "node_exporter.default.j2", {**v, "node_exporter_install_method": "artifact"}
    )
    assert LOCK["artifacts"]["node_exporter"]["version"].startswith("1.0")
    assert any(a.startswith("--collector.filesystem.ignored-mount-points=") for a in old)


@pytest.mark.parametrize(
    ("receiver", "url"), [("none", ""), ("webhook", "https://hooks.example.org/lcm")], ids=["none", "webhook"]
)
def test_alertmanager_config_from_the_spec_passes_amtool(tmp_path: Path, receiver: str, url: str) -> None:
    spec = copy.deepcopy(LAB)
    spec["monitoring"]["alertmanager"] = {"receiver": receiver, "webhook_url": url, "group_wait_s": 7}
    assert rules.spec_rules(spec) == []
    text = render("alertmanager", "alertmanager.yml.j2", _vars(spec))
    config = tmp_path / "alertmanager.yml"
    config.write_text(text)
    p = subprocess.run([_tool("amtool"), "check-config", str(config)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    doc = yaml.safe_load(text)
    assert doc["route"]["group_wait"] == "7s"
    assert doc["route"]["receiver"] == ("webhook" if receiver == "webhook" else "keep")
    hooks = [c["url"] for r in doc["receivers"] for c in r.get("webhook_configs", [])]
    assert hooks == ([url] if url else [])


def test_the_listen_address_is_the_cluster_interface_unless_every_address_is_asked_for() -> None:
    facts = {
        "ansible_facts": {"eth0": {"ipv4": {"address": "10.0.0.7"}}, "ib0": {"ipv4": {"address": "10.1.0.7"}}}
    }
    fact = "ansible_facts[_monitoring_ifname | replace('-', '_')].ipv4.address"
    expr = f"'0.0.0.0' if _monitoring_bind_any else {fact}"
    spec = copy.deepcopy(LAB)
    assert evaluate("_monitoring", expr, {"cluster": spec, **facts}) == "10.0.0.7"  # fabric.socket_ifname
    spec["monitoring"]["listen_ifname"] = "ib0"
    assert evaluate("_monitoring", expr, {"cluster": spec, **facts}) == "10.1.0.7"
    spec["monitoring"]["bind_any_address"] = True
    assert evaluate("_monitoring", expr, {"cluster": spec, **facts}) == "0.0.0.0"


def test_the_slurm_collector_unit_writes_into_the_textfile_dir() -> None:
    unit = render("slurm_metrics", "lcm-slurm-metrics.service.j2", _vars(LAB))
    exec_start = next(ln for ln in unit.splitlines() if ln.startswith("ExecStart="))
    assert exec_start.split()[1:4] == ["metrics", "slurm", "--out"]
    assert "/var/lib/prometheus/node-exporter/lcm_slurm.prom" in exec_start
    assert "Group=lcm-metrics" in unit


@pytest.mark.parametrize(
    ("change", "path"),
    [
        ({"alertmanager": {"receiver": "webhook"}}, "cluster.monitoring.alertmanager.webhook_url"),
        (
            {"alertmanager": {"webhook_url": "http://x.example"}},
            "cluster.monitoring.alertmanager.webhook_url",
        ),
        ({"textfile_dir": "/var/lib"}, "cluster.monitoring.textfile_dir"),
        ({"textfile_dir": "/etc/node-exporter"}, "cluster.monitoring.textfile_dir"),
    ],
)
def test_monitoring_spec_rules(change: dict, path: str) -> None:
    spec = copy.deepcopy(LAB)
    spec["monitoring"].update(change)
    errors: list[SpecError] = rules.spec_rules(spec)
    assert [e.path for e in errors] == [path]
