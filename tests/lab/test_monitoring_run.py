"""The monitoring layer end to end on the podman lab, after the lab's `lcm-runner all` run.

- The runner's per-rank training metrics (docs/monitoring.md, "Training metrics") reached Prometheus
  through the nodes' textfile collectors: every rank of the run's last job, every metric of the contract,
  with the labels job_id, rank, attempt and node (and no `job` label of the runner's own).
- The recording rules evaluate for that job (step-time mean and p99, loss spread, comm fraction).
- One real alert end to end: node_exporter stopped on a compute node -> the scrape-target-down alert
  fires in Prometheus -> Alertmanager has it (its v2 API) -> the exporter is started again (always).

Run from the host (molecule verify runs it): `LCM_LAB=1 pytest tests/lab/test_monitoring_run.py`.
Prometheus and Alertmanager are reached at the lab controller's address (env LCM_LAB_PROMETHEUS,
LCM_LAB_ALERTMANAGER override).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from labrun import LabRun, unavailable

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
PROM = os.environ.get("LCM_LAB_PROMETHEUS", "http://10.89.42.10:9090")
AM = os.environ.get("LCM_LAB_ALERTMANAGER", "http://10.89.42.10:9093")
NODE = os.environ.get("LCM_LAB_ALERT_NODE", "lab-node2")
# Per-rank series of the contract every step-making, checkpointing rank publishes (the lab measures comm).
PER_RANK = [
    "lcm_train_running",
    "lcm_train_last_step",
    "lcm_train_last_step_timestamp_seconds",
    "lcm_train_step_seconds",
    "lcm_train_step_duration_seconds_count",
    "lcm_train_step_seconds_total",
    "lcm_train_loss",
    "lcm_train_local_loss",
    "lcm_train_tokens_per_second",
    "lcm_train_comm_fraction",
    "lcm_train_checkpoint_duration_seconds",
    "lcm_train_checkpoint_bytes",
    "lcm_train_last_checkpoint_step",
    "lcm_train_last_checkpoint_timestamp_seconds",
    "lcm_train_restarts",
    "lcm_train_rank_info",
]


def _get(url: str, timeout: float = 10) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read().decode())


def _query(expr: str) -> list[dict[str, Any]]:
    body = _get(f"{PROM}/api/v1/query?query={urllib.parse.quote(expr)}")
    assert body["status"] == "success", body
    return body["data"]["result"]


@pytest.fixture(scope="module")
def prometheus() -> str:
    try:
        with urllib.request.urlopen(f"{PROM}/-/ready", timeout=10) as r:
            assert r.status == 200
    except OSError as exc:
        unavailable(f"the lab's Prometheus does not answer at {PROM}: {exc}")
    return PROM


def _stage(run_dir: Path, name: str) -> dict[str, Any]:
    return json.loads((run_dir / "stages" / f"{name}.json").read_text())


def _jobs(run: LabRun) -> list[str]:
    """The Slurm job ids the run's stages submitted, in submission order."""
    ids = [
        str(j)
        for name in ("baseline", "resume", "fault")
        if (run.dir / "stages" / f"{name}.json").exists()
        for j in _stage(run.dir, name).get("job_ids", [])
        if str(j).isdigit()
    ]
    assert ids, "the run recorded no Slurm job id"
    return sorted(set(ids), key=int)


def _last_job(run: LabRun) -> str:
    return _jobs(run)[-1]


def _world() -> int:
    cfg = yaml.safe_load((ROOT / "configs" / "lab.yml").read_text())
    return int(cfg["nodes"]) * int(cfg["procs_per_node"])


def test_every_rank_of_the_last_job_published_every_training_metric(
    prometheus: str, lab_run_result: LabRun
) -> None:
    job = _last_job(lab_run_result)
    ranks = {str(r) for r in range(_world())}
    # The job's files stay in the textfile directories until a newer job replaces them; a range query
    # covers the case where that already happened.
    deadline = time.monotonic() + 60
    missing: dict[str, set[str]] = {}
    while True:
        missing = {}
        for metric in PER_RANK:
            got = _query(f'last_over_time({metric}{{job_id="{job}"}}[2h])')
            seen = {r["metric"].get("rank", "") for r in got}
            if not ranks <= seen:
                missing[metric] = ranks - seen
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(3)
    assert not missing, f"job {job}: ranks missing per metric: {missing}"
    sample = _query(f'last_over_time(lcm_train_last_step{{job_id="{job}"}}[2h])')
    for r in sample:
        labels = r["metric"]
        assert {"job_id", "rank", "attempt", "node"} <= set(labels), labels
        assert labels["job"] == "node", labels  # the scrape job; the runner sets no `job` label of its own
        assert labels["node"].startswith("lab-node"), labels


def test_the_run_trained_to_its_last_step_and_checkpointed(prometheus: str, lab_run_result: LabRun) -> None:
    """Some of the run's jobs train to train_iters (the baseline, the resumed job, the fault stage's
    reference runs; others are killed on purpose): for every rank, the newest step Prometheus saw over
    the run's jobs is train_iters, and every rank reported a checkpoint with bytes."""
    jobs = "|".join(_jobs(lab_run_result))
    iters = int(yaml.safe_load((ROOT / "configs" / "lab.yml").read_text())["train_iters"])
    steps = _query(f'max by (rank) (max_over_time(lcm_train_last_step{{job_id=~"{jobs}"}}[2h]))')
    assert {r["metric"]["rank"] for r in steps} == {str(r) for r in range(_world())}, steps
    assert all(int(float(r["value"][1])) == iters for r in steps), steps
    ckpt = _query(f'max by (rank) (max_over_time(lcm_train_checkpoint_bytes{{job_id=~"{jobs}"}}[2h]))')
    assert len(ckpt) == _world() and all(float(r["value"][1]) > 0 for r in ckpt), ckpt


def test_the_baseline_jobs_writers_published_its_end(prometheus: str, lab_run_result: LabRun) -> None:
    """The baseline stage's job finishes cleanly: each node's writer is stopped by its node task after
    the agent and publishes a last file, so every rank's newest samples say lcm_train_running 0 at
    train_iters, with the baseline step time (published from step 25 on). Before the agent's sweep
    spared the writer, it SIGKILLed it at the end of every job: the newest sample was whatever the last
    5 s tick had seen (running 1 at step 27 of 30, in one lab run), and the baseline series existed only
    when a tick fell between step 25 and the end."""
    job = str(_stage(lab_run_result.dir, "baseline")["job_ids"][0])
    iters = int(yaml.safe_load((ROOT / "configs" / "lab.yml").read_text())["train_iters"])
    ranks = {str(r) for r in range(_world())}
    want = {"lcm_train_running": 0.0, "lcm_train_last_step": float(iters)}
    deadline = time.monotonic() + 60
    while True:
        got = {
            metric: {r["metric"]["rank"]: float(r["value"][1])
                     for r in _query(f'last_over_time({metric}{{job_id="{job}"}}[2h])')}
            for metric in (*want, "lcm_train_step_seconds_baseline")
        }  # fmt: skip
        ok = all(got[m] == dict.fromkeys(ranks, v) for m, v in want.items())
        if (ok and set(got["lcm_train_step_seconds_baseline"]) == ranks) or time.monotonic() > deadline:
            break
        time.sleep(3)
    for metric, value in want.items():
        assert got[metric] == dict.fromkeys(ranks, value), (job, metric, got[metric])
    assert set(got["lcm_train_step_seconds_baseline"]) == ranks, (job, got["lcm_train_step_seconds_baseline"])
    assert all(v > 0 for v in got["lcm_train_step_seconds_baseline"].values()), got


def test_the_recording_rules_evaluate_for_the_run(prometheus: str, lab_run_result: LabRun) -> None:
    """Every record has values for the run's jobs, each a number >= 0 (never NaN). Over all the run's
    jobs: a short job whose steps all fell between two writes of its node's file has counters seen at one
    value only, so no rate record (promtool's case: tests/monitoring/rules/train.test.yml, job 7070)."""
    jobs = "|".join(_jobs(lab_run_result))
    for record in (
        "lcm:train_step_seconds:mean5m",
        "lcm:train_step_seconds:p99_5m",
        "lcm:train_local_loss:spread",
        "lcm:train_comm_fraction:5m",
    ):
        got = _query(f'max_over_time({record}{{job_id=~"{jobs}"}}[2h])')
        assert got, f"{record} never had a value for any job of the run ({jobs})"
        assert all(float(r["value"][1]) >= 0 for r in got), (record, got)  # NaN >= 0 is False


def _target_down_alert() -> str:
    for group in _get(f"{PROM}/api/v1/rules")["data"]["groups"]:
        for rule in group["rules"]:
            if rule["type"] == "alerting" and rule["name"] == "LcmTargetDown":
                return str(rule["name"])
    pytest.fail("the LcmTargetDown alert rule is not loaded")


def _podman(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *argv], capture_output=True, text=True, timeout=60, check=False)


def test_a_stopped_exporter_alerts_through_alertmanager(prometheus: str) -> None:
    name = _target_down_alert()
    spec = yaml.safe_load((ROOT / "inventories/lab/group_vars/all/cluster.yml").read_text())["cluster"]
    mon = spec["monitoring"]
    wait_s = mon["alerts"]["target_down_for_s"] + 4 * mon["scrape_interval_s"] + 60
    assert _podman("exec", NODE, "systemctl", "stop", "prometheus-node-exporter").returncode == 0
    t0 = time.monotonic()
    try:
        firing: list[dict[str, Any]] = []
        while time.monotonic() - t0 < wait_s and not firing:
            time.sleep(2)
            firing = [
                a
                for a in _get(f"{AM}/api/v2/alerts?active=true")
                if a["labels"].get("alertname") == name and a["labels"].get("node") == NODE
            ]
        assert firing, f"{name} for {NODE} not in Alertmanager after {wait_s} s"
        alert = firing[0]
        took = time.monotonic() - t0
        print(f"{name} for {NODE} in Alertmanager {took:.1f} s after the stop: {alert['labels']}")
        assert alert["status"]["state"] == "active"
        assert alert["annotations"].get("summary") and alert["annotations"].get("runbook")
        prom_alerts = _get(f"{PROM}/api/v1/alerts")["data"]["alerts"]
        assert any(
            (a["labels"].get("alertname"), a["labels"].get("node"), a["state"]) == (name, NODE, "firing")
            for a in prom_alerts
        )
    finally:
        _podman("exec", NODE, "systemctl", "start", "prometheus-node-exporter")
    # Back up: the target is scraped again and the alert stops firing in Prometheus.
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        up = _query(f'up{{job="node",node="{NODE}"}}')
        alerts = [
            a
            for a in _get(f"{PROM}/api/v1/alerts")["data"]["alerts"]
            if a["labels"].get("alertname") == name and a["labels"].get("node") == NODE
        ]
        if up and up[0]["value"][1] == "1" and not alerts:
            return
        time.sleep(2)
    pytest.fail(f"{NODE}'s exporter not back up, or {name} still firing, {wait_s} s after the restart")
