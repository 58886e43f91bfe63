"""The Prometheus recording and alert rules (roles/prometheus/templates/lcm_*.rules.yml.j2), rendered by
Ansible's engine for the lab and the example-h200 inventories and checked by the real promtool
(.cache/tools/bin/promtool, put there by scripts/bootstrap): `promtool check rules`, and `promtool test rules`
with the unit tests in tests/monitoring/rules (the top-level files for every inventory, <inventory>/ for one).

Structure: every alert has a firing and a not-firing case, every record an expression test, every alert its
severity, summary, description and runbook (a section of docs/alerts.md), and the thresholds come from
cluster.monitoring.alerts (a non-default threshold moves what promtool sees fire).
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from _role_render import REPO, render

PROMTOOL = REPO / ".cache/tools/bin/promtool"
TESTS = REPO / "tests/monitoring/rules"
ALERTS_DOC = REPO / "docs/alerts.md"
RULE_FILES = ("lcm_recording.rules.yml", "lcm_alerts.rules.yml")
INVENTORIES = ("lab", "example-h200")
SEVERITIES = {"page", "ticket"}


def _spec(inventory: str) -> dict[str, Any]:
    path = REPO / "inventories" / inventory / "group_vars/all/cluster.yml"
    return yaml.safe_load(path.read_text())["cluster"]


def _with_alerts(spec: dict[str, Any], **alerts: Any) -> dict[str, Any]:
    spec = copy.deepcopy(spec)
    spec.setdefault("monitoring", {}).setdefault("alerts", {}).update(alerts)
    return spec


def _promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    # Fail, not skip: the rules are untested without it.
    assert PROMTOOL.is_file(), f"{PROMTOOL.relative_to(REPO)} is missing: run scripts/bootstrap"
    return subprocess.run(
        [str(PROMTOOL), *args], cwd=cwd, capture_output=True, text=True, timeout=300, check=False
    )


def _render_rules(spec: dict[str, Any], dest: Path) -> dict[str, str]:
    """Render both templates into dest under the file names the role installs; the texts by name."""
    dest.mkdir(parents=True, exist_ok=True)
    texts = {}
    for name in RULE_FILES:
        texts[name] = render("prometheus", f"{name}.j2", {"cluster": spec})
        (dest / name).write_text(texts[name])
    return texts


def _test_files(inventory: str) -> list[Path]:
    return sorted(TESTS.glob("*.test.yml")) + sorted((TESTS / inventory).glob("*.test.yml"))


def _rules(texts: dict[str, str], kind: str) -> list[dict[str, Any]]:
    return [
        rule
        for text in texts.values()
        for group in yaml.safe_load(text)["groups"]
        for rule in group["rules"]
        if kind in rule
    ]


class Rendered:
    def __init__(self, inventory: str, workdir: Path) -> None:
        self.inventory = inventory
        self.workdir = workdir
        self.texts = _render_rules(_spec(inventory), workdir)
        self.test_names = []
        for path in _test_files(inventory):
            name = path.name if path.parent == TESTS else f"{inventory}-{path.name}"
            shutil.copyfile(path, workdir / name)
            self.test_names.append(name)
        self.tests = {name: yaml.safe_load((workdir / name).read_text()) for name in self.test_names}
        self.alerts = _rules(self.texts, "alert")
        self.records = _rules(self.texts, "record")


@pytest.fixture(scope="module", params=INVENTORIES)
def rendered(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Rendered:
    return Rendered(request.param, tmp_path_factory.mktemp(f"rules-{request.param}"))


def test_promtool_check_rules(rendered: Rendered) -> None:
    result = _promtool("check", "rules", *RULE_FILES, cwd=rendered.workdir)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(RULE_FILES), result.stdout


def test_promtool_unit_tests(rendered: Rendered) -> None:
    assert rendered.test_names, "no promtool test files"
    for tests in rendered.tests.values():
        assert tests["rule_files"] == list(RULE_FILES)
    result = _promtool("test", "rules", *rendered.test_names, cwd=rendered.workdir)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(rendered.test_names), result.stdout


def _alert_cases(tests: dict[str, Any]) -> list[tuple[str, bool]]:
    """(alertname, fires) of every alert_rule_test case; `exp_alerts: []` spelled out counts as not firing."""
    cases = []
    for doc in tests.values():
        for group in doc["tests"]:
            for case in group.get("alert_rule_test") or []:
                assert isinstance(case.get("exp_alerts"), list), (
                    f"{case['alertname']}: exp_alerts must be a list"
                )
                cases.append((case["alertname"], bool(case["exp_alerts"])))
    return cases


def test_every_alert_has_a_firing_and_a_not_firing_case(rendered: Rendered) -> None:
    cases = _alert_cases(rendered.tests)
    names = {rule["alert"] for rule in rendered.alerts}
    assert len(names) == len(rendered.alerts), "alert names must be unique"
    for name in sorted(names):
        assert (name, True) in cases, f"{rendered.inventory}: no test case where {name} fires"
        assert (name, False) in cases, f"{rendered.inventory}: no test case where {name} does not fire"
    unknown = {name for name, _ in cases} - names
    assert not unknown, f"test cases for alerts the rules do not have: {sorted(unknown)}"


def test_every_record_has_an_expression_test(rendered: Rendered) -> None:
    exprs = [
        case["expr"]
        for doc in rendered.tests.values()
        for group in doc["tests"]
        for case in group.get("promql_expr_test") or []
    ]
    for rule in rendered.records:
        record = rule["record"]
        assert re.fullmatch(r"lcm:[a-z0-9_]+(:[a-z0-9_]+)?", record), f"{record}: not lcm:metric[:operations]"
        assert any(re.search(rf"{re.escape(record)}(?![\w:])", expr) for expr in exprs), (
            f"no promql_expr_test reads {record}"
        )


def test_alerts_read_only_existing_records(rendered: Rendered) -> None:
    records = {rule["record"] for rule in rendered.records}
    for rule in rendered.alerts + rendered.records:
        used = set(re.findall(r"\blcm:[a-z0-9_:]+", rule["expr"]))
        assert used <= records, (
            f"{rule.get('alert') or rule['record']} reads unknown records {used - records}"
        )


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors (lowercase, punctuation dropped, spaces to '-')."""
    headings = re.findall(r"^#{1,6} (.+?)\s*$", markdown, flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def test_alerts_have_severity_annotations_and_a_runbook_section(rendered: Rendered) -> None:
    anchors = _anchors(ALERTS_DOC.read_text())
    for rule in rendered.alerts:
        name = rule["alert"]
        assert rule["labels"]["severity"] in SEVERITIES, name
        annotations = rule["annotations"]
        assert {"summary", "description", "runbook"} <= set(annotations), name
        assert all(str(annotations[key]).strip() for key in ("summary", "description")), name
        assert annotations["runbook"] == f"docs/alerts.md#{name.lower()}", name
        assert name.lower() in anchors, f"docs/alerts.md has no section for {name}"
        assert re.fullmatch(r"\d+s", str(rule["for"])), (
            f"{name}: for: {rule['for']!r} is not rendered seconds"
        )


def test_rule_files_shape(rendered: Rendered) -> None:
    groups = {
        name: [g["name"] for g in yaml.safe_load(text)["groups"]] for name, text in rendered.texts.items()
    }
    assert groups == {"lcm_recording.rules.yml": ["lcm-recording"], "lcm_alerts.rules.yml": ["lcm-alerts"]}
    for text in rendered.texts.values():
        assert text.startswith("# managed by lcm-infra\n")  # the ansible_managed line
    records = [rule["record"] for rule in rendered.records]
    assert records[0] == "lcm:train_rank_live", "the records after it read it in the same evaluation"
    contract = {
        "lcm:train_step_seconds:mean5m",
        "lcm:train_step_seconds:p99_5m",
        "lcm:train_local_loss:spread",
        "lcm:train_comm_fraction:5m",
        "lcm:train_rank_live",
    }
    assert contract <= set(records), "docs/monitoring.md's recording rules"


def test_nic_rules_follow_the_fabric(tmp_path: Path) -> None:
    lab = _alerts_text(_spec("lab"))
    h200 = _alerts_text(_spec("example-h200"))
    assert "node_infiniband" not in lab  # ethernet: no HCAs
    assert 'device=~"eth0"' in lab
    assert 'device=~"bond0"' in h200
    for i in range(8):
        assert f'node_infiniband_state_id{{device="mlx5_{i}"}}' in h200  # each HCA missing is caught
    # listen_ifname joins the cluster interfaces (dots matched literally); NCCL's exclusions name none.
    spec = copy.deepcopy(_spec("lab"))
    spec["fabric"]["socket_ifname"] = "^docker,lo"
    spec.setdefault("monitoring", {})["listen_ifname"] = "ens1.100"
    text = _alerts_text(spec)
    assert 'device=~"ens1[.]100"' in text
    assert "docker" not in text
    (tmp_path / "rules.yml").write_text(text)
    result = _promtool("check", "rules", "rules.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


# Each threshold with a non-default value, and what the alert's expression or for: must then say.
THRESHOLDS = [
    ("gpu_temp_c", 70, "LcmGpuTemperature", "expr", "DCGM_FI_DEV_GPU_TEMP > 70"),
    ("no_step_minutes", 7, "LcmTrainNoStep", "expr", ") > 420"),
    ("no_step_minutes", 7, "LcmTrainNoFirstStep", "for", "420s"),
    ("checkpoint_age_minutes", 45, "LcmCheckpointStale", "expr", "> 2700"),
    ("step_p99_regression_ratio", 1.25, "LcmTrainStepTimeRegression", "expr", "> on (job_id) 1.25 *"),
    ("loss_spread_max", 0.8, "LcmTrainLossSpread", "expr", "lcm:train_local_loss:spread > 0.8"),
    ("comm_fraction_max", 0.35, "LcmTrainCommFraction", "expr", "lcm:train_comm_fraction:5m > 0.35"),
    ("nic_flaps_max", 5, "LcmNicFlapping", "expr", ") > 5"),
    ("target_down_for_s", 45, "LcmTargetDown", "for", "45s"),
    ("target_down_for_s", 45, "LcmSlurmNodeDown", "for", "45s"),
    ("for_s", 240, "LcmTrainStepTimeRegression", "for", "240s"),
    ("for_s", 240, "LcmTrainLossSpread", "for", "240s"),
    ("for_s", 240, "LcmTrainCommFraction", "for", "240s"),
]


@pytest.mark.parametrize(("field", "value", "alert", "key", "expected"), THRESHOLDS)
def test_threshold_comes_from_the_spec(field: str, value: Any, alert: str, key: str, expected: str) -> None:
    def rule(spec: dict[str, Any]) -> str:
        rules = {r["alert"]: r for r in _rules({"alerts": _alerts_text(spec)}, "alert")}
        return str(rules[alert][key])

    assert expected in rule(_with_alerts(_spec("lab"), **{field: value}))
    assert expected not in rule(_spec("lab")), "pick a value that differs from the default"


def test_every_threshold_field_is_used() -> None:
    schema = yaml.safe_load((REPO / "lcm_runner/spec/schema.yml").read_text())
    fields = schema["properties"]["monitoring"]["properties"]["alerts"]["properties"]
    assert set(fields) == {field for field, *_ in THRESHOLDS}


def _alerts_text(spec: dict[str, Any]) -> str:
    return render("prometheus", "lcm_alerts.rules.yml.j2", {"cluster": spec})


def _selector(metric: str, labels: dict[str, str]) -> str:
    return metric + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def _threshold_tests() -> dict[str, Any]:
    """75 C on GPU 0 (69 C on GPU 1) from 1m; gpu02's node_exporter down from 1m."""
    gpu = {"modelName": "NVIDIA H200", "job": "dcgm", "instance": "gpu01:9400", "node": "gpu01"}
    gpu0 = {"gpu": "0", "UUID": "GPU-0e11", "device": "nvidia0", **gpu}
    gpu1 = {"gpu": "1", "UUID": "GPU-1c7d", "device": "nvidia1", **gpu}
    target = {"job": "node", "instance": "gpu02:9100", "node": "gpu02"}

    def fires(
        alertname: str, at: str, labels: dict[str, str], summary: str, description: str
    ) -> dict[str, Any]:
        annotations = {
            "summary": summary,
            "description": description,
            "runbook": f"docs/alerts.md#{alertname.lower()}",
        }
        exp = [{"exp_labels": {"severity": "ticket", **labels}, "exp_annotations": annotations}]
        return {"eval_time": at, "alertname": alertname, "exp_alerts": exp}

    return {
        "rule_files": list(RULE_FILES),
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": [
                    {"series": _selector("DCGM_FI_DEV_GPU_TEMP", gpu0), "values": "60x4 75x40"},
                    {"series": _selector("DCGM_FI_DEV_GPU_TEMP", gpu1), "values": "69x44"},
                    {"series": _selector("up", target), "values": "1x4 0x60"},
                ],
                "alert_rule_test": [
                    fires(
                        "LcmGpuTemperature",
                        "5m",
                        gpu0,
                        "GPU 0 of gpu01 at 75 C",
                        "GPU 0 (GPU-0e11) on gpu01 is at 75 C, above 70 C.",
                    ),
                    {"eval_time": "6m", "alertname": "LcmTargetDown", "exp_alerts": []},
                    fires(
                        "LcmTargetDown",
                        "11m30s",
                        target,
                        "node target on gpu02 down",
                        "Prometheus cannot scrape the node exporter of gpu02 (gpu02:9100).",
                    ),
                ],
            }
        ],
    }


def test_promtool_sees_the_spec_thresholds(tmp_path: Path) -> None:
    """gpu_temp_c 70: 75 C fires, 69 C does not; target_down_for_s 600: down 5 minutes is still pending,
    10.5 minutes fires. The same cases fail against the default thresholds (87 C, 120 s)."""
    (tmp_path / "thresholds.test.yml").write_text(yaml.safe_dump(_threshold_tests(), sort_keys=False))
    _render_rules(_with_alerts(_spec("lab"), gpu_temp_c=70, target_down_for_s=600), tmp_path)
    result = _promtool("test", "rules", "thresholds.test.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    _render_rules(_with_alerts(_spec("lab"), gpu_temp_c=87, target_down_for_s=120), tmp_path)
    result = _promtool("test", "rules", "thresholds.test.yml", cwd=tmp_path)
    assert result.returncode != 0
    out = result.stdout + result.stderr
    assert "alertname: LcmGpuTemperature" in out
    assert "alertname: LcmTargetDown, time: 6m" in out


def test_the_unit_tests_catch_a_moved_threshold(tmp_path: Path) -> None:
    """The committed tests bite: with gpu_temp_c 95 the 90 C case no longer fires and promtool says so."""
    _render_rules(_with_alerts(_spec("lab"), gpu_temp_c=95), tmp_path)
    shutil.copyfile(TESTS / "gpu.test.yml", tmp_path / "gpu.test.yml")
    result = _promtool("test", "rules", "gpu.test.yml", cwd=tmp_path)
    assert result.returncode != 0
    assert "alertname: LcmGpuTemperature" in result.stdout + result.stderr


# Rules weakened on purpose (in the rendered text) and the committed test file whose near misses catch it.
MUTATIONS = [
    ("lcm_recording.rules.yml", "(lcm_train_running == 1)", "(lcm_train_running >= 0)", "train.test.yml"),
    (
        "lcm_recording.rules.yml",
        "heartbeat_timestamp_seconds < 60)",
        "heartbeat_timestamp_seconds < 1e9)",
        "train.test.yml",
    ),
    (
        "lcm_alerts.rules.yml",
        "lcm:train_step_seconds:max5m > on (job_id)",
        "lcm:train_step_seconds:p99_5m > on (job_id)",
        "train.test.yml",
    ),
    ("lcm_alerts.rules.yml", "DCGM_FI_DEV_XID_ERRORS == 45", "DCGM_FI_DEV_XID_ERRORS == 46", "gpu.test.yml"),
    (
        "lcm_alerts.rules.yml",
        "offset 10m\n          ) > 3",
        "offset 10m\n          ) >= 3",
        "lab/nic.test.yml",
    ),
]


@pytest.mark.parametrize(("rule_file", "old", "new", "test_file"), MUTATIONS)
def test_the_unit_tests_catch_a_weakened_rule(
    tmp_path: Path, rule_file: str, old: str, new: str, test_file: str
) -> None:
    texts = _render_rules(_spec("lab"), tmp_path)
    assert texts[rule_file].count(old) == 1, f"{old!r} not (once) in the rendered {rule_file}"
    (tmp_path / rule_file).write_text(texts[rule_file].replace(old, new))
    shutil.copyfile(TESTS / test_file, tmp_path / Path(test_file).name)
    result = _promtool("test", "rules", Path(test_file).name, cwd=tmp_path)
    assert result.returncode != 0, f"{test_file} passes with {new!r} instead of {old!r}"
