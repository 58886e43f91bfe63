"""The Grafana dashboards (lcm_runner/dashboards/, committed as roles/grafana/files/dashboards/*.json):
the committed files are a fresh build, every panel matches its spec (and expectation) by id and title,
every query reads only the contract's metric names (docs/monitoring.md, the schema's DCGM fields, an
allow-list of node_exporter metrics) with the `node` label, and parses: the real promtool reads every
query, variables substituted as Grafana would, as a recording rule (promtool 2.42 has no bare "parse").
The DCGM fixture the lab test loads is checked here too (promtool's parser, every default field)."""

from __future__ import annotations

import json
import re
import subprocess
import typing
from pathlib import Path

import pytest
import yaml

from lcm_runner.dashboards import DASHBOARDS, panels_by_id
from lcm_runner.dashboards.build import DOCS, JSON_DIR, main, problems
from lcm_runner.dashboards.common import Source
from lcm_runner.dashboards.promql import metric_names, substitute, variables_outside_regex
from lcm_runner.spec import fill_defaults

ROOT = Path(__file__).resolve().parents[2]
PROMTOOL = ROOT / ".cache" / "tools" / "bin" / "promtool"
FIXTURE = ROOT / "tests" / "fixtures" / "dcgm" / "dcgm-exporter.prom"
DCGM_FIELDS = fill_defaults({})["monitoring"]["dcgm"]["fields"]
DCGM_LABELS = {"gpu", "UUID", "device", "modelName", "Hostname", "pci_bus_id", "DCGM_FI_DRIVER_VERSION"}

# node_exporter 1.5 metrics the dashboards may read, by collector (names from node_exporter's source).
NODE_EXPORTER = frozenset(
    {
        # netdev
        "node_network_receive_bytes_total",
        "node_network_transmit_bytes_total",
        "node_network_receive_errs_total",
        "node_network_transmit_errs_total",
        # netclass
        "node_network_carrier_changes_total",
        # netstat (default --collector.netstat.fields keeps Tcp_RetransSegs and Tcp_OutSegs)
        "node_netstat_Tcp_RetransSegs",
        "node_netstat_Tcp_OutSegs",
        # diskstats
        "node_disk_written_bytes_total",
        # mountstats (off unless --collector.mountstats)
        "node_mountstats_nfs_total_write_bytes_total",
        # infiniband: node_infiniband_<name>{device, port}
        "node_infiniband_port_data_received_bytes_total",
        "node_infiniband_port_data_transmitted_bytes_total",
        "node_infiniband_state_id",
        "node_infiniband_physical_state_id",
        "node_infiniband_symbol_error_total",
        "node_infiniband_link_error_recovery_total",
        "node_infiniband_link_downed_total",
        "node_infiniband_port_errors_received_total",
        "node_infiniband_port_discards_transmitted_total",
    }
)


def _contract_names() -> set[str]:
    """lcm_train_*, lcm_slurm_* and lcm:* names docs/monitoring.md lists (histograms with their series)."""
    text = (ROOT / "docs" / "monitoring.md").read_text(encoding="utf-8")
    names = set(re.findall(r"`(lcm_(?:train|slurm)_[a-z_]+|lcm:[a-z0-9_:]+)[`{]", text))
    for h in re.findall(r"^\| `(lcm_[a-z_]+)` \| histogram \|", text, re.MULTILINE):
        names |= {f"{h}_bucket", f"{h}_sum", f"{h}_count"}
    return names


CONTRACT = _contract_names()
ALLOWED = CONTRACT | set(DCGM_FIELDS) | NODE_EXPORTER


def _committed() -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted((ROOT / JSON_DIR).glob("*.json"))}


def _panels(d: dict) -> list[dict]:
    return [p for p in d["panels"] if p["type"] != "row"]


def _targets() -> list[tuple[str, str, str]]:
    """(uid, panel title, expr) of every target of every committed dashboard."""
    return [
        (uid, p["title"], t["expr"])
        for uid, d in _committed().items()
        for p in _panels(d)
        for t in p["targets"]
    ]


def _tool(path: Path) -> str:
    if not path.exists():
        pytest.fail(f"{path} is missing: run scripts/bootstrap (it unpacks promtool and amtool)")
    return str(path)


def test_the_contract_lists_the_names_the_dashboards_need() -> None:
    assert {"lcm_train_running", "lcm_train_step_duration_seconds_bucket", "lcm_slurm_jobs"} <= CONTRACT
    assert {"lcm:train_rank_live", "lcm:train_step_seconds:p99_5m", "lcm:train_comm_fraction:5m"} <= CONTRACT


def test_committed_files_are_a_fresh_build() -> None:
    assert problems(ROOT) == []
    p = subprocess.run([ROOT / "scripts" / "gen-dashboards", "--check"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert sorted(_committed()) == sorted(d.uid for d in DASHBOARDS)


def test_check_names_a_stale_and_an_extra_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--root", str(tmp_path)]) == 0
    assert main(["--check", "--root", str(tmp_path)]) == 0
    stale = tmp_path / JSON_DIR / "lcm-training.json"
    stale.write_text(stale.read_text().replace("Last step", "Last stop"))
    (tmp_path / JSON_DIR / "old.json").write_text("{}")
    (tmp_path / DOCS).write_text("hand edit\n")
    capsys.readouterr()
    assert main(["--check", "--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert f"{stale} is stale" in err and "old.json is not made by any dashboard" in err
    assert f"{tmp_path / DOCS} is stale" in err
    assert main(["--root", str(tmp_path)]) == 0  # regenerating mends it and removes the extra file
    assert main(["--check", "--root", str(tmp_path)]) == 0
    assert not (tmp_path / JSON_DIR / "old.json").exists()


def test_every_panel_matches_its_spec_and_expectation_by_id_and_title() -> None:
    committed = _committed()
    sources = set(typing.get_args(Source))
    for d in DASHBOARDS:
        spec = panels_by_id(d)
        got = {p["id"]: p for p in _panels(committed[d.uid])}
        assert sorted(got) == sorted(spec), d.uid
        for pid, p in spec.items():
            assert got[pid]["title"] == p.title, (d.uid, pid)
            assert [t["expr"] for t in got[pid]["targets"]] == [t.expr for t in p.targets]
            assert p.expect.source in sources
            assert (p.expect.source == "production") == bool(p.expect.why), p.title
        ids = [p["id"] for p in committed[d.uid]["panels"]]
        assert len(ids) == len(set(ids)), d.uid


def test_every_panel_has_a_query_on_the_datasource_variable() -> None:
    for uid, d in _committed().items():
        for p in d["panels"]:
            if p["type"] == "row":
                assert not p.get("targets"), (uid, p["title"])
                continue
            assert p["targets"] and all(t["expr"].strip() for t in p["targets"]), (uid, p["title"])
            refs = [p["datasource"], *(t["datasource"] for t in p["targets"])]
            assert all(r == {"type": "prometheus", "uid": "${datasource}"} for r in refs), (uid, p["title"])


def test_uids_tags_and_variables() -> None:
    committed = _committed()
    uids = [d["uid"] for d in committed.values()]
    assert len(uids) == len(set(uids)) and all(u.startswith("lcm-") for u in uids)
    for stem, d in committed.items():
        assert d["uid"] == stem and "lcm-infra" in d["tags"]
        variables = {v["name"]: v for v in d["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["query"] == "prometheus"
        assert variables["node"]["query"] == "label_values(up, node)"
        uses_job = any("$job_id" in t["expr"] for p in _panels(d) for t in p["targets"])
        assert ("job_id" in variables) == uses_job, stem
        if uses_job:
            assert variables["job_id"]["query"] == "label_values(lcm_train_running, job_id)"
        for name in ("node", "job_id"):
            if name in variables:
                v = variables[name]
                assert v["datasource"]["uid"] == "${datasource}" and v["multi"] and v["allValue"] == ".*"


def test_metric_names_are_the_contracts_dcgm_fields_or_allowed_node_exporter_ones() -> None:
    unknown = [
        (uid, title, name)
        for uid, title, expr in _targets()
        for name in metric_names(expr)
        if name not in ALLOWED
    ]
    assert unknown == []
    assert all(metric_names(expr) for _, _, expr in _targets())


def test_metric_names_finds_every_selected_name_and_nothing_else() -> None:
    expr = (
        'sum by (node, gpu) (rate(a_total{node=~"$node", x="rate(b)"}[$__rate_interval])) / 1e9'
        " * on (node, gpu) group_left (job_id, rank) max by (node) (c:rec:5m and on (node) d)"
        " - time() + histogram_quantile(0.99, sum by (le) (rate(e_bucket[5m]))) > bool 0"
    )
    assert metric_names(expr) == ["a_total", "c:rec:5m", "d", "e_bucket"]
    assert "no_such_metric" not in ALLOWED and metric_names("no_such_metric") == ["no_such_metric"]


def test_queries_use_the_node_label_rate_interval_and_regex_variables() -> None:
    for uid, d in _committed().items():
        text = json.dumps(d)
        assert not re.search("hostname", text, re.IGNORECASE), uid
        assert "instance" not in text, uid
    for uid, title, expr in _targets():
        where = (uid, title, expr)
        assert not re.search(r"[{,]\s*job\s*[=!]", expr), where  # DCGM series come through another job too
        assert variables_outside_regex(expr) == [], where
        for window in re.findall(r"\b(?:rate|irate)\((?:[^()]|\([^()]*\))*?\[([^\]]*)\]", expr):
            assert window == "$__rate_interval", where


def _promtool_rules(tmp_path: Path, exprs: dict[str, str]) -> subprocess.CompletedProcess[str]:
    rules = [{"record": name, "expr": expr} for name, expr in exprs.items()]
    path = tmp_path / "dashboards.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}, sort_keys=False))
    return subprocess.run([_tool(PROMTOOL), "check", "rules", str(path)], capture_output=True, text=True)


def test_every_query_parses_with_promtool(tmp_path: Path) -> None:
    exprs = {}
    for uid, d in _committed().items():
        for p in _panels(d):
            for t in p["targets"]:
                name = f"dashboard_{uid.replace('-', '_')}_{p['id']}_{t['refId']}"
                exprs[name] = substitute(t["expr"])
    assert len(exprs) == len(_targets())
    assert not [e for e in exprs.values() if "$" in e]
    p = _promtool_rules(tmp_path, exprs)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in p.stdout


def test_promtool_rejects_a_query_that_does_not_parse(tmp_path: Path) -> None:
    broken = substitute('sum by (node) (rate(node_disk_written_bytes_total{node=~"$node"}[$__rate_interval])')
    p = _promtool_rules(tmp_path, {"dashboard_ok": "vector(1)", "dashboard_broken": broken})
    assert p.returncode != 0 and "dashboard_broken" in p.stdout + p.stderr


def test_substitute_replaces_every_variable_as_grafana_would() -> None:
    expr = 'rate(x{node=~"$node", job_id=~"${job_id}"}[$__rate_interval])'
    assert substitute(expr) == 'rate(x{node=~".*", job_id=~".*"}[1m])'
    assert substitute(expr, rate_interval="20s", values={"job_id": "49|50"}) == (
        'rate(x{node=~".*", job_id=~"49|50"}[20s])'
    )
    assert variables_outside_regex('x{node="$node"}') == ["$node"]
    with pytest.raises(ValueError, match="unknown variable"):
        substitute("x[$range]")


def _fixture_samples() -> dict[str, list[dict[str, str]]]:
    """Family -> label sets of its samples; HELP and TYPE lines must come before a family's samples."""
    sample = re.compile(r"^([A-Za-z_:][\w:]*)\{([^}]*)\} (\S+)$")
    out: dict[str, list[dict[str, str]]] = {}
    declared: dict[str, set[str]] = {}
    for line in FIXTURE.read_text().splitlines():
        if line.startswith("# "):
            kind, name = line.split()[1:3]
            declared.setdefault(name, set()).add(kind)
            continue
        m = sample.match(line)
        assert m, line
        name = m.group(1)
        assert declared.get(name) == {"HELP", "TYPE"}, name
        float(m.group(3))
        out.setdefault(name, []).append(dict(re.findall(r'(\w+)="([^"]*)"', m.group(2))))
    return out


def test_dcgm_fixture_parses_and_has_every_default_field_on_two_gpus() -> None:
    p = subprocess.run(
        [_tool(PROMTOOL), "check", "metrics"], input=FIXTURE.read_text(), capture_output=True, text=True
    )
    # rc 3: lint findings only (dcgm-exporter's names: camelCase labels, counters without _total); 1: no parse
    assert p.returncode in (0, 3) and "parsing error" not in p.stdout + p.stderr, p.stdout + p.stderr
    samples = _fixture_samples()
    assert list(samples) == DCGM_FIELDS
    for name, label_sets in samples.items():
        assert [s["gpu"] for s in label_sets] == ["0", "1"], name
        assert all(set(s) == DCGM_LABELS for s in label_sets), name
        assert all("node" not in s for s in label_sets)  # Prometheus adds it as a target label


def test_dcgm_fixture_help_and_type_are_what_our_exporter_prints() -> None:
    """dcgm-exporter prints the counters file's type and help; roles/dcgm_exporter renders that file from
    its field catalog, so the fixture's HELP/TYPE lines are the catalog's (rates only on counters)."""
    catalog = yaml.safe_load((ROOT / "roles/dcgm_exporter/vars/main.yml").read_text())[
        "_dcgm_exporter_field_catalog"
    ]
    declared = re.findall(r"^# (HELP|TYPE) (\S+) (.*)$", FIXTURE.read_text(), re.MULTILINE)
    assert len(declared) == 2 * len(DCGM_FIELDS)
    for kind, name, text in declared:
        assert text == catalog[name]["help" if kind == "HELP" else "type"], (kind, name)
    for d in DASHBOARDS:
        for p in panels_by_id(d).values():
            for t in p.targets:
                for name in re.findall(r"\b(?:rate|irate|increase)\((DCGM_FI_\w+)", t.expr):
                    assert catalog[name]["type"] == "counter", (d.uid, p.title, name)


def test_every_dcgm_panel_reads_fixture_series_only() -> None:
    fixture = set(_fixture_samples())
    for d in DASHBOARDS:
        for p in panels_by_id(d).values():
            names = {n for t in p.targets for n in metric_names(t.expr)}
            if p.expect.source == "dcgm":
                assert names <= fixture, (d.uid, p.title)
            if names & set(DCGM_FIELDS) and p.expect.source == "lab":
                pytest.fail(f"{d.uid} {p.title}: reads DCGM series, which the lab has only as a fixture")
