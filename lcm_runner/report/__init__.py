"""`lcm-runner report`: infra_slo.md, slo.json, multi_node_run.log and plots/*.png of a run directory.

from lcm_runner.report import build_report
line = build_report(run_dir, cfg, compare="earlier/slo.json")   # "PASS: ..." / "FAIL: ..."
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jinja2

from lcm_runner import telemetry
from lcm_runner.config import ConfigError, RunConfig, Targets, load_run_config
from lcm_runner.report import runlog, slo, workload
from lcm_runner.report.slo import FAIL, PASS, SKIP, STAGES, SloReport, fmt

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"

__all__ = ["build_report", "fmt", "slo"]


def _nccl(run_dir: Path, stages: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    st = stages.get("nccl_profile")
    if st and isinstance(st.get("metrics"), dict) and "ranks" in st["metrics"]:
        return st["metrics"]
    d = run_dir / "nccl"
    if d.is_dir() and any(d.glob("*.log")):
        from lcm_runner.nccl import profile_dir

        return profile_dir(d)  # logs without a stage result: summarised, no spec expectations
    return None


def build_report(
    run_dir: str | Path,
    cfg: RunConfig | None = None,
    compare: str | Path | None = None,
) -> str:
    """Write the report files into run_dir; returns the one-line verdict."""
    run_dir = Path(run_dir).resolve()
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: no such run directory")
    targets = cfg.targets if cfg is not None else Targets()
    earlier = None
    if compare is not None:
        earlier = json.loads(Path(compare).read_text(encoding="utf-8"))
    rep: SloReport = slo.build(run_dir, targets, earlier, str(compare) if compare else None)
    stats = telemetry.ParseStats()
    records = telemetry.load_run(run_dir, stats=stats)
    nccl = _nccl(run_dir, rep.stages)
    if note := slo.container_note(records):
        rep.stops.append(note)
    wl = workload.section(cfg, records)

    from lcm_runner.report import plots

    drawn = plots.draw_all(run_dir, records, rep.stages, rep.rows)
    (run_dir / "multi_node_run.log").write_text(
        runlog.render(run_dir, records, rep.stages, nccl, stats.total_skipped), encoding="utf-8"
    )
    out = rep.to_json()
    out["generated"] = datetime.now(UTC).isoformat(timespec="seconds")
    out["plots"] = drawn
    out["config"] = cfg.name if cfg is not None else None
    out["workload"] = workload.as_dict(wl)
    (run_dir / "slo.json").write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
    )
    md = env.get_template("infra_slo.md.j2").render(
        run_name=cfg.name if cfg is not None else run_dir.name,
        run_dir=str(run_dir),
        generated=out["generated"],
        verdict=rep.verdict,
        rows=rep.rows,
        stages=rep.stages,
        stage_order=list(STAGES) + [s for s in rep.stages if s not in STAGES],
        regressions=rep.regressions,
        compared_with=rep.baseline_of_comparison,
        nccl=nccl,
        plots=drawn,
        problems=rep.problems,
        stops=rep.stops,
        workload=wl,
        fmt=fmt,
        targets=targets,
    )
    (run_dir / "infra_slo.md").write_text(md, encoding="utf-8")
    counts = {s: sum(1 for r in rep.rows if r.status == s) for s in (PASS, FAIL, SKIP)}
    regress = f", {len(rep.regressions)} regression(s)" if compare is not None else ""
    return (
        f"{rep.verdict}: {counts[PASS]} SLO(s) met, {counts[FAIL]} failed, "
        f"{counts[SKIP]} not measured{regress}; "
        f"{run_dir / 'infra_slo.md'}"
    )


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "report",
        help="write infra_slo.md, slo.json, multi_node_run.log and plots/ of a run directory",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--run-dir", required=True, help="the run directory (holding stages/ and telemetry/)")
    p.add_argument("--config", "-c", help="run config whose targets apply (default: the module's targets)")
    p.add_argument("--compare", metavar="SLO_JSON", help="an earlier run's slo.json: flag regressions")
    p.set_defaults(func=run_cli)
    return p


def run_cli(ns: argparse.Namespace) -> int:
    try:
        cfg = load_run_config(ns.config) if ns.config else None
        print(f"run dir: {Path(ns.run_dir).resolve()}")
        line = build_report(ns.run_dir, cfg, ns.compare)
    except (ConfigError, FileNotFoundError, json.JSONDecodeError) as exc:
        print(f"report: {exc}", file=sys.stderr)
        return 2
    print(f"report: {line}")
    print(f"run dir: {Path(ns.run_dir).resolve()}")
    return 1 if line.startswith(FAIL) else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="lcm-runner")
    sub = ap.add_subparsers(dest="command", required=True)
    add_parser(sub)
    ns = ap.parse_args(["report", *(argv if argv is not None else sys.argv[1:])])
    return int(ns.func(ns))
