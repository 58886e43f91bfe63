"""Every panel query of the committed Grafana dashboards (roles/grafana/files/dashboards/*.json), sent to
the lab's Prometheus after a `lcm-runner all` run on the lab's Slurm.

No Grafana server runs here: no Grafana package is reachable from the lab (it runs on production
clusters only). This test stands in for Grafana: it substitutes the dashboards' variables as Grafana
does (`$node` = All, `$job_id` = this run's Slurm jobs, `$__rate_interval` = 4 x the scrape interval)
and sends each query to Prometheus's HTTP API. The lab has no GPUs either: DCGM panels are checked
against fixture series in dcgm-exporter's exposition format (tests/fixtures/dcgm/dcgm-exporter.prom),
not against a real dcgm-exporter.

Steps:
1. The run: the session fixture `lab_run_result` (tests/lab/conftest.py, `lcm-runner all` on the lab's
   Slurm). Its window is from its stage records (stages/*.json: started .. ended, and the Slurm job
   ids); Prometheus must hold its training series: the newest `lcm_train_last_step_timestamp_seconds`
   of those jobs lies inside the window.
2. The DCGM fixture is copied into lab-node1's node_exporter textfile directory (`podman cp` to a .tmp
   name, mode 0644, renamed to dcgm_fixture.prom), and the test waits until Prometheus has scraped every
   field on both GPUs at least twice (rates need two samples). It is removed at teardown, always.
3. For every target of every panel: an instant query at a time inside the run window must succeed (it
   parsed and evaluated). Panels whose source is `lab` must return series inside the run window (a
   range query over it, one point per scrape interval: Grafana's time series view); `dcgm` panels must
   return series now (the fixture is loaded); `production` panels (InfiniBand, NFS, GPUs under the ranks)
   only need to evaluate. A table of panel -> series counts is printed.

Run from the host: `pytest -m lab tests/lab` (molecule verify, LCM_LAB=1: a missing lab or Prometheus
is then a failure). LCM_LAB_PROMETHEUS overrides the Prometheus URL.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from labrun import FORCED, LAB, unavailable

from lcm_runner.dashboards import DASHBOARDS, panels_by_id
from lcm_runner.dashboards.build import JSON_DIR
from lcm_runner.dashboards.promql import substitute
from lcm_runner.spec import fill_defaults

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = os.environ.get("LCM_LAB_PROMETHEUS", "http://10.89.42.10:9090").rstrip("/")
DCGM_NODE = os.environ.get("LCM_LAB_DCGM_NODE", "lab-node1")  # container name = inventory name = `node`
FIXTURE = ROOT / "tests" / "fixtures" / "dcgm" / "dcgm-exporter.prom"
LAB_SPEC = fill_defaults(
    yaml.safe_load((ROOT / "inventories/lab/group_vars/all/cluster.yml").read_text())["cluster"]
)
TEXTFILE_DIR = LAB_SPEC["monitoring"]["textfile_dir"]
DCGM_FIELDS = LAB_SPEC["monitoring"]["dcgm"]["fields"]


class Prometheus:
    """The few calls of Prometheus's HTTP API this test needs (urllib). Queries go as POST form bodies
    (no URL length limit); label values and the config are GET-only endpoints."""

    def __init__(self, url: str) -> None:
        self.url = url

    def api(self, path: str, *, post: bool = False, **params: Any) -> dict[str, Any]:
        body = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None}, doseq=True)
        url = f"{self.url}/api/v1/{path}"
        if post:
            req = urllib.request.Request(url, data=body.encode(), method="POST")
            req.add_header("Content-Type", "application/x-www-form-urlencoded")
        else:
            req = urllib.request.Request(f"{url}?{body}" if body else url)
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:  # 400/422: a query that does not parse or evaluate
            return json.loads(e.read() or b'{"status": "error", "error": "empty body"}')

    def query(self, expr: str, at: float | None = None) -> dict[str, Any]:
        return self.api("query", post=True, query=expr, time=at)

    def query_range(self, expr: str, start: float, end: float, step: float) -> dict[str, Any]:
        return self.api("query_range", post=True, query=expr, start=start, end=end, step=step)

    def value(self, expr: str, at: float | None = None) -> float | None:
        """The value of a query that returns one sample (None when it returns none)."""
        got = self.query(expr, at)
        assert got["status"] == "success", (expr, got)
        result = got["data"]["result"]
        return float(result[0]["value"][1]) if result else None

    def scrape_interval_s(self) -> float:
        """The node job's scrape interval (else the global one): what Grafana's datasource would be set to."""
        got = self.api("status/config")
        assert got["status"] == "success", got
        config = yaml.safe_load(got["data"]["yaml"])
        node = [j for j in config.get("scrape_configs", []) if j.get("job_name") == "node"]
        raw = (node[0] if node else {}).get("scrape_interval") or config["global"]["scrape_interval"]
        return _seconds(raw)


def _seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    parts = re.findall(r"(\d+)(ms|s|m|h)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    return sum(int(n) * units[u] for n, u in parts)


@dataclass(frozen=True)
class Window:
    start: float
    end: float
    job_ids: tuple[str, ...]
    last_step_ts: float  # the run's newest step, as Prometheus has it
    scrape_s: float

    @property
    def rate_interval(self) -> str:
        return f"{round(4 * self.scrape_s)}s"  # Grafana's $__rate_interval floor: 4 x scrape interval


@pytest.fixture(scope="module")
def prometheus() -> Prometheus:
    if not ((LAB / "READY").exists() or FORCED) or shutil.which("podman") is None:
        unavailable("the lab is not up (.lab/READY missing; LCM_LAB=1 forces)")
    try:
        with urllib.request.urlopen(f"{PROMETHEUS}/-/ready", timeout=10) as r:
            ready = r.status == 200
    except OSError as e:
        ready, why = False, str(e)
    else:
        why = "not ready"
    if not ready:
        unavailable(f"the lab's Prometheus at {PROMETHEUS} does not answer ({why}; LCM_LAB_PROMETHEUS)")
    return Prometheus(PROMETHEUS)


@pytest.fixture(scope="module")
def window(prometheus: Prometheus, request: pytest.FixtureRequest) -> Window:
    # Looked up only once the lab answers: without a lab the module skips before any run is started.
    run = request.getfixturevalue("lab_run_result")
    stages = [json.loads(p.read_text()) for p in sorted((Path(run.dir) / "stages").glob("*.json"))]
    assert stages, f"no stage records in {run.dir}/stages"
    job_ids = tuple(sorted({j for s in stages for j in s.get("job_ids", [])}, key=int))
    assert job_ids, "the run's stages name no Slurm job"
    scrape_s = prometheus.scrape_interval_s()
    start = min(s["started"] for s in stages)
    end = max(s["ended"] for s in stages) + 2 * scrape_s  # the last job's final file is scraped by then
    wait = end - time.time()
    if wait > 0:
        time.sleep(wait)
    span = math.ceil(end - start) + 60
    last = prometheus.value(
        f'max(max_over_time(lcm_train_last_step_timestamp_seconds{{job_id=~"{"|".join(job_ids)}"}}[{span}s]))',
        end,
    )
    assert last is not None, f"Prometheus has no training series of the run's jobs {job_ids}"
    assert start <= last <= end, (start, last, end)
    return Window(start, end, job_ids, last, scrape_s)


def _podman(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *argv], capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture(scope="module")
def dcgm_fixture(prometheus: Prometheus, window: Window) -> Iterator[None]:
    final = f"{TEXTFILE_DIR}/dcgm_fixture.prom"
    tmp = f"{final}.tmp"  # the textfile collector reads *.prom only: never a half-copied file
    try:
        p = _podman("cp", str(FIXTURE), f"{DCGM_NODE}:{tmp}")
        assert p.returncode == 0, p.stderr
        p = _podman("exec", DCGM_NODE, "sh", "-c", f"chmod 0644 {tmp} && mv -f {tmp} {final}")
        assert p.returncode == 0, p.stderr
        selector = f'{{__name__=~"DCGM_FI_.*", node="{DCGM_NODE}"}}'
        deadline = time.time() + 8 * window.scrape_s + 60
        while True:
            present = prometheus.value(f"count({selector})")
            samples = prometheus.value(
                f'min(count_over_time(DCGM_FI_DEV_GPU_TEMP{{node="{DCGM_NODE}"}}[{window.rate_interval}]))'
            )
            if present == 2 * len(DCGM_FIELDS) and (samples or 0) >= 2:
                break
            assert time.time() < deadline, (
                f"the DCGM fixture in {DCGM_NODE}:{final} was not scraped: {present} series "
                f"(want {2 * len(DCGM_FIELDS)}), {samples} samples in {window.rate_interval}"
            )
            time.sleep(min(5.0, window.scrape_s))
        got = prometheus.query(f"count by (__name__) ({selector})")["data"]["result"]
        assert sorted(r["metric"]["__name__"] for r in got) == sorted(DCGM_FIELDS)
        yield
    finally:
        p = _podman("exec", DCGM_NODE, "rm", "-f", final, tmp)
        assert p.returncode == 0, f"could not remove {DCGM_NODE}:{final}: {p.stderr}"


def _series(answer: dict[str, Any]) -> int | str:
    """How many series a query or range query answered, or its error."""
    if answer["status"] != "success":
        return f"error: {answer.get('error')}"
    return len(answer["data"]["result"])


def test_the_variables_find_the_lab_nodes_and_the_runs_jobs(prometheus: Prometheus, window: Window) -> None:
    """The dashboards' variable queries: label_values(up, node), label_values(lcm_train_running, job_id)."""
    nodes = prometheus.api("label/node/values", **{"match[]": "up"}, start=window.start, end=window.end)
    assert nodes["status"] == "success" and DCGM_NODE in nodes["data"], nodes
    jobs = prometheus.api(
        "label/job_id/values", **{"match[]": "lcm_train_running"}, start=window.start, end=window.end
    )
    assert jobs["status"] == "success", jobs
    seen = set(jobs["data"]) & set(window.job_ids)
    print(f"job_id values of the run seen by Prometheus: {sorted(seen, key=int)} of {window.job_ids}")
    assert seen, (window.job_ids, jobs["data"])


def test_every_panel_query_evaluates_and_lab_and_dcgm_panels_return_series(
    prometheus: Prometheus, window: Window, dcgm_fixture: None, capsys: pytest.CaptureFixture[str]
) -> None:
    values = {"job_id": "|".join(window.job_ids)}
    at = min(window.end, window.last_step_ts + 2 * window.scrape_s)  # inside the run window
    step = max(1.0, window.scrape_s / 2)
    rows, failures = [], []
    for d in DASHBOARDS:
        committed = json.loads((ROOT / JSON_DIR / f"{d.uid}.json").read_text())
        expect = panels_by_id(d)
        for panel in (p for p in committed["panels"] if p["type"] != "row"):
            spec = expect[panel["id"]]
            assert spec.title == panel["title"], (d.uid, panel["id"])
            source = spec.expect.source
            for t in panel["targets"]:
                expr = substitute(t["expr"], rate_interval=window.rate_interval, values=values)
                where = f"{d.uid} #{panel['id']} {panel['title']!r} {t['refId']} [{source}]"
                at_t = _series(prometheus.query(expr, at))
                in_window: int | str = ""
                now: int | str = ""
                if isinstance(at_t, str):
                    failures.append(f"{where}: {at_t}: {expr}")
                elif source == "lab":
                    in_window = _series(prometheus.query_range(expr, window.start, window.end, step))
                    if isinstance(in_window, str) or not in_window:
                        failures.append(f"{where}: no series in the run window ({in_window}): {expr}")
                elif source == "dcgm":
                    now = _series(prometheus.query(expr))
                    if isinstance(now, str) or not now:
                        failures.append(f"{where}: no series with the DCGM fixture loaded ({now}): {expr}")
                rows.append((where, at_t, in_window, now))
    width = max(len(r[0]) for r in rows)
    with capsys.disabled():  # the table shows in molecule's output whether the test passes or not
        print(f"\nseries per query ({window.rate_interval} rate interval, jobs {'|'.join(window.job_ids)})")
        print(f"{'dashboard #panel title ref [source]':{width}}  at t  window  now")
        for where, n_at, n_window, n_now in rows:
            print(f"{where:{width}}  {n_at!s:>4}  {n_window!s:>6}  {n_now!s:>3}")
    assert not failures, "\n".join(failures)
