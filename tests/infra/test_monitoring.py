"""The monitoring layer on a converged cluster (docs/monitoring.md).

node_exporter on every node, on the cluster address only, with the textfile directory the runner writes;
Prometheus and Alertmanager on the monitoring hosts, on the cluster address only, Alertmanager without its
cluster (gossip) listener; every scrape target Prometheus has is up and the set is exactly the one the
inventory implies (nothing listed by hand); both lcm rule groups loaded with every rule of the installed
files; Prometheus sends to Alertmanager; the Slurm state collector's series arrive; dcgm-exporter exactly on
the compute nodes with GPUs.

The Prometheus and Alertmanager APIs are read from the monitoring host itself (python3 on the node), so the
test needs no route from where pytest runs to the cluster network.

Run: pytest tests/infra/test_monitoring.py --hosts=ansible://all --ansible-inventory=inventories/<name>
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import testinfra
import yaml
from conftest import cluster_spec, role_var

FETCH = (
    "python3 -c 'import sys, urllib.request; "
    'print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())\' "{}"'
)


def _monitoring_on(host: Any) -> dict[str, Any]:
    spec = cluster_spec(host)
    if not spec["layers"]["monitoring"]:
        pytest.skip("cluster.layers.monitoring is off")
    return spec


def _ifname(spec: dict[str, Any]) -> str:
    return spec["monitoring"]["listen_ifname"] or spec["fabric"]["socket_ifname"]


def _address(host: Any, spec: dict[str, Any]) -> str:
    if spec["monitoring"]["bind_any_address"]:
        return "0.0.0.0"
    addrs = [a for a in host.interface(_ifname(spec)).addresses if ":" not in a]
    assert addrs, f"no IPv4 address on {_ifname(spec)}"
    return addrs[0]


def _listeners(host: Any) -> set[str]:
    """'<address>:<port>' of every listening TCP socket (ss)."""
    out = host.check_output("ss -Hltn")
    return {line.split()[3] for line in out.splitlines() if line.strip()}


def _get_json(host: Any, url: str) -> Any:
    return json.loads(host.check_output(FETCH.format(url)))


def _group_hosts(host: Any, group: str) -> list[str]:
    return sorted(set(host.ansible.get_variables()["groups"].get(group, [])))


def _local(host: Any, spec: dict[str, Any]) -> str:
    """The address to reach a service of this host that listens on the cluster address."""
    return _address(host, spec).replace("0.0.0.0", "127.0.0.1")


def _prom(host: Any, spec: dict[str, Any]) -> str:
    return f"http://{_local(host, spec)}:{role_var(host, 'prometheus', 'prometheus_port')}"


def _query(host: Any, spec: dict[str, Any], expr: str) -> list[dict[str, Any]]:
    from urllib.parse import quote

    body = _get_json(host, f"{_prom(host, spec)}/api/v1/query?query={quote(expr)}")
    assert body["status"] == "success", body
    return body["data"]["result"]


def test_node_exporter_on_the_cluster_address_with_the_textfile_dir(host: Any) -> None:
    spec = _monitoring_on(host)
    service = host.service("prometheus-node-exporter")
    assert service.is_running and service.is_enabled
    addr = _address(host, spec)
    port = role_var(host, "node_exporter", "node_exporter_port")
    listeners = _listeners(host)
    assert f"{addr}:{port}" in listeners, listeners
    if addr != "0.0.0.0":
        assert f"0.0.0.0:{port}" not in listeners and f"*:{port}" not in listeners, listeners
    d = host.file(spec["monitoring"]["textfile_dir"])
    assert d.is_directory and d.group == spec["monitoring"]["textfile_group"]
    assert d.mode == 0o2775, oct(d.mode)
    metrics = host.check_output(FETCH.format(f"http://{_local(host, spec)}:{port}/metrics"))
    assert 'node_scrape_collector_success{collector="textfile"} 1' in metrics
    assert 'node_scrape_collector_success{collector="netclass"} 1' in metrics


@pytest.mark.groups("monitoring")
def test_prometheus_and_alertmanager_on_the_cluster_address_only(host: Any) -> None:
    spec = _monitoring_on(host)
    listeners = _listeners(host)
    addr = _address(host, spec)
    for service, role, var in (
        ("prometheus", "prometheus", "prometheus_port"),
        ("prometheus-alertmanager", "alertmanager", "alertmanager_port"),
    ):
        assert host.service(service).is_running and host.service(service).is_enabled, service
        port = role_var(host, role, var)
        assert f"{addr}:{port}" in listeners, (service, listeners)
        if addr != "0.0.0.0":
            assert f"0.0.0.0:{port}" not in listeners and f"*:{port}" not in listeners, (service, listeners)
    # Alertmanager's HA listener (default :9094, every address) is off for a single instance.
    assert not any(sock.endswith(":9094") for sock in listeners), listeners
    am = f"http://{_local(host, spec)}:{role_var(host, 'alertmanager', 'alertmanager_port')}"
    assert _get_json(host, f"{am}/api/v2/status")["cluster"]["status"] == "disabled"


def _expected_targets(host: Any, spec: dict[str, Any]) -> set[tuple[str, str]]:
    """(job, node) of every target the inventory implies."""
    want = {("node", h) for h in _group_hosts(host, role_var(host, "prometheus", "prometheus_node_group"))}
    monitoring = _group_hosts(host, "monitoring")
    want |= {("prometheus", h) for h in monitoring} | {("alertmanager", h) for h in monitoring}
    if spec["gpu"]["count_per_node"] > 0:
        dcgm = _group_hosts(host, role_var(host, "prometheus", "prometheus_dcgm_group"))
        want |= {("dcgm", h) for h in dcgm}
    return want


@pytest.mark.groups("monitoring")
def test_every_target_the_inventory_implies_is_scraped_and_up(host: Any) -> None:
    spec = _monitoring_on(host)
    want = _expected_targets(host, spec)
    deadline = time.monotonic() + 3 * spec["monitoring"]["scrape_interval_s"] + 30
    while True:
        active = _get_json(host, f"{_prom(host, spec)}/api/v1/targets?state=active")["data"]["activeTargets"]
        got = {(t["labels"]["job"], t["labels"].get("node", "")): t["health"] for t in active}
        if set(got) == want and all(h == "up" for h in got.values()):
            break
        if time.monotonic() > deadline:
            pytest.fail(f"targets {got} (health by (job, node)); expected exactly {sorted(want)}, all up")
        time.sleep(2)
    # The same, through PromQL: up == 1 for every target.
    up = {(r["metric"]["job"], r["metric"]["node"]): r["value"][1] for r in _query(host, spec, "up")}
    assert set(up) == want and set(up.values()) == {"1"}, up


@pytest.mark.groups("monitoring")
def test_every_installed_rule_is_loaded(host: Any) -> None:
    spec = _monitoring_on(host)
    installed: dict[str, set[str]] = {}
    for name in ("lcm_recording.rules.yml", "lcm_alerts.rules.yml"):
        doc = yaml.safe_load(host.file(f"/etc/prometheus/rules/{name}").content_string)
        for group in doc["groups"]:
            installed[group["name"]] = {r.get("alert") or r.get("record") for r in group["rules"]}
    assert {"lcm-recording", "lcm-alerts"} <= set(installed)
    loaded = {
        g["name"]: {r["name"] for r in g["rules"]}
        for g in _get_json(host, f"{_prom(host, spec)}/api/v1/rules")["data"]["groups"]
    }
    assert loaded == installed
    assert all(
        r["health"] == "ok"
        for g in _get_json(host, f"{_prom(host, spec)}/api/v1/rules")["data"]["groups"]
        for r in g["rules"]
    )


@pytest.mark.groups("monitoring")
def test_prometheus_sends_to_alertmanager(host: Any) -> None:
    spec = _monitoring_on(host)
    port = role_var(host, "alertmanager", "alertmanager_port")
    active = _get_json(host, f"{_prom(host, spec)}/api/v1/alertmanagers")["data"]["activeAlertmanagers"]
    assert {a["url"] for a in active} == {
        f"http://{h}:{port}/api/v2/alerts" for h in _group_hosts(host, "monitoring")
    }, active


@pytest.mark.groups("monitoring")
def test_the_slurm_state_collector_reports(host: Any) -> None:
    spec = _monitoring_on(host)
    if not spec["layers"]["slurm"]:
        pytest.skip("cluster.layers.slurm is off")
    ctl = _group_hosts(host, "controller")[0]
    ok = _query(host, spec, "lcm_slurm_collect_success")
    assert [(r["metric"]["node"], r["value"][1]) for r in ok] == [(ctl, "1")], ok
    nodes = _query(host, spec, "lcm_slurm_node_up")
    assert {r["metric"]["slurm_node"] for r in nodes} >= set(_group_hosts(host, "compute")), nodes


@pytest.mark.groups("controller")
def test_the_slurm_state_collector_runs_on_the_controller(host: Any) -> None:
    spec = _monitoring_on(host)
    if not spec["layers"]["slurm"]:
        pytest.skip("cluster.layers.slurm is off")
    assert host.service("lcm-slurm-metrics").is_running
    assert host.service("lcm-slurm-metrics").is_enabled


@pytest.mark.groups("compute")
def test_dcgm_exporter_exactly_on_gpu_nodes(host: Any) -> None:
    spec = _monitoring_on(host)
    unit = host.file("/etc/systemd/system/dcgm-exporter.service")
    if spec["gpu"]["count_per_node"] == 0:
        assert not unit.exists, "dcgm-exporter installed on a node without GPUs"
        return
    assert host.service("dcgm-exporter").is_running
    port = role_var(host, "prometheus", "prometheus_dcgm_exporter_port")
    body = host.check_output(FETCH.format(f"http://{_local(host, spec)}:{port}/metrics"))
    missing = [f for f in spec["monitoring"]["dcgm"]["fields"] if f"\n{f}{{" not in f"\n{body}"]
    assert not missing, missing


def test_the_monitoring_hosts_resolve_every_target(host: Any) -> None:
    """Targets are inventory names: the monitoring host must resolve each one (as Slurm resolves nodes)."""
    _monitoring_on(host)
    inventory = host.backend.ansible_inventory
    for mon in _group_hosts(host, "monitoring"):
        mhost = testinfra.get_host(f"ansible://{mon}", ansible_inventory=inventory)
        name = host.backend.get_hostname()
        assert mhost.run(f"getent hosts {name}").rc == 0, f"{mon} cannot resolve {name}"
