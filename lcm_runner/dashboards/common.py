"""What every dashboard shares: the panel/row/dashboard specs (with each panel's expectation of where
its series come from), the datasource and template variables, selectors, and rendering a spec into
Grafana's dashboard JSON with grafana_foundation_sdk's builders.

Conventions (docs/monitoring.md is the contract): queries select and group by the target label `node`
(never an exporter's host label), rates use `$__rate_interval`, no query filters on `job` (DCGM series
may reach Prometheus through another scrape job), and `$node`/`$job_id` appear only in regex matchers
(`=~"$node"`: Grafana expands a multi-value selection into a regex).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm

from lcm_runner.spec import fill_defaults

Source = Literal["lab", "dcgm", "production"]
# What docs/dashboards.md says for each source.
SOURCE_TEXT: dict[str, str] = {"lab": "lab", "dcgm": "dcgm fixture", "production": "production only"}

TAGS = ["lcm-infra"]
DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")

# Selectors and the rate window, pasted into the queries of every dashboard module.
N = '{node=~"$node"}'  # per-node series (node_exporter, dcgm-exporter)
J = '{job_id=~"$job_id"}'  # per-job series (recording rules keep job_id only)
JN = '{job_id=~"$job_id", node=~"$node"}'  # per-rank training series
RATE = "[$__rate_interval]"

# Alert thresholds drawn on the panels they belong to: the schema's defaults (docs/monitoring.md).
ALERTS: dict[str, Any] = fill_defaults({})["monitoring"]["alerts"]


@dataclass(frozen=True)
class Expect:
    """Where a panel's series come from, and so what the lab test asserts about its queries.

    lab: the podman lab produces them (a lab run's queries must return series); dcgm: dcgm-exporter on GPU
    nodes (the lab test loads fixture series in dcgm-exporter's format, then they must return series);
    production: only a production cluster has them (InfiniBand, NFS, GPUs under the ranks): the queries
    must parse and evaluate, `why` says what the lab lacks.
    """

    source: Source
    why: str = ""

    def __post_init__(self) -> None:
        if (self.source == "production") != bool(self.why):
            raise ValueError("a production-only panel says why the lab lacks its series (and only it)")


LAB = Expect("lab")
DCGM = Expect("dcgm")


def production(why: str) -> Expect:
    return Expect("production", why)


@dataclass(frozen=True)
class Target:
    expr: str
    legend: str = ""


@dataclass(frozen=True)
class Panel:
    title: str
    targets: tuple[Target, ...]
    expect: Expect
    unit: str = "short"
    description: str = ""
    kind: Literal["timeseries", "stat"] = "timeseries"
    width: int = 12
    stack: bool = False
    threshold: float | None = None  # drawn red from this value on


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...]


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    rows: tuple[Row, ...]
    job_variable: bool = False  # the job_id variable (dashboards of training series)


def q(expr: str, legend: str = "") -> Target:
    return Target(" ".join(expr.split()), legend)


def panels_by_id(d: Dashboard) -> dict[int, Panel]:
    """The dashboard's panels by the id render() gives them (rows take ids too: 1, 2, ... in order)."""
    out: dict[int, Panel] = {}
    pid = 0
    for row in d.rows:
        pid += 1
        for p in row.panels:
            pid += 1
            out[pid] = p
    return out


def _query_variable(name: str, label: str, query: str) -> db.QueryVariable:
    return (
        db.QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query(query)
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dm.VariableSort.NATURAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .current(dm.VariableOption(selected=True, text="All", value="$__all"))
    )


def _thresholds(value: float | None) -> db.ThresholdsConfig:
    steps = [dm.Threshold(value=None, color="green")]
    if value is not None:
        steps.append(dm.Threshold(value=value, color="red"))
    return db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(steps)


def _panel(p: Panel, pid: int) -> Any:
    if p.kind == "stat":
        b: Any = stat.Panel().reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]))
    else:
        b = (
            timeseries.Panel()
            .legend(
                cb.VizLegendOptions()
                .display_mode(cm.LegendDisplayMode.LIST)
                .placement(cm.LegendPlacement.BOTTOM)
                .show_legend(True)
            )
            .fill_opacity(10)
        )
        if p.stack:
            b = b.stacking(cb.StackingConfig().mode(cm.StackingMode.NORMAL)).fill_opacity(60)
        if p.threshold is not None:
            b = b.thresholds_style(cb.GraphThresholdsStyleConfig().mode(cm.GraphThresholdsStyleMode.LINE))
    b = b.id(pid).title(p.title).datasource(DATASOURCE).unit(p.unit).span(p.width).height(8)
    b = b.thresholds(_thresholds(p.threshold))
    if p.description:
        b = b.description(p.description)
    for i, t in enumerate(p.targets):
        target = prometheus.Dataquery().ref_id(chr(ord("A") + i)).datasource(DATASOURCE).expr(t.expr)
        if t.legend:
            target = target.legend_format(t.legend)
        b = b.with_target(target.instant() if p.kind == "stat" else target.range())
    return b


def render(d: Dashboard) -> dm.Dashboard:
    """The dashboard model (JSON through the SDK's encoder): ids stable by position, see panels_by_id."""
    b = (
        db.Dashboard(d.title)
        .uid(d.uid)
        .description(d.description)
        .tags(TAGS)
        .readonly()
        .time("now-3h", "now")
        .refresh("30s")
        .timezone("utc")
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .with_variable(db.DatasourceVariable("datasource").label("Data source").type("prometheus"))
        .with_variable(_query_variable("node", "Node", "label_values(up, node)"))
    )
    if d.job_variable:
        b = b.with_variable(_query_variable("job_id", "Job", "label_values(lcm_train_running, job_id)"))
    ids = iter(range(1, 10_000))
    for row in d.rows:
        b = b.with_row(db.Row(row.title).id(next(ids)))
        for p in row.panels:
            b = b.with_panel(_panel(p, next(ids)))
    return b.build()
