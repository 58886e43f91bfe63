"""`lcm-runner health check` (registered by lcm_runner/cli.py; docs/health.md).

    lcm-runner health check --expect /etc/lcm/node-health.json [--json OUT] [--markdown OUT] [--drain]
                            [--from-dir CAPTURE_DIR]

Runs this node's checks (GPUs, NVLink, XIDs, Fabric Manager, HCAs) against the expectation and prints
one line per check and the verdict. Exit 0: healthy; 1: unhealthy (with --drain the node is drained in
Slurm, Reason "lcm-health: <failing checks>"); 2: bad input (the expectation is missing or invalid).
--from-dir reads a capture (scripts/gpu/capture_health.sh's file names) instead of running the commands.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from . import collect
from .evaluate import evaluate
from .expect import ExpectError, load
from .report import Report


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "health",
        help="per-node health checks: GPUs, NVLink, XIDs, Fabric Manager, HCAs (docs/health.md)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="health_command", required=True, metavar="what")
    c = sub.add_parser("check", help="check this node against its expectation file")
    c.add_argument("--expect", required=True, type=Path, help="the expectation (/etc/lcm/node-health.json)")
    c.add_argument("--json", dest="json_out", type=Path, help="write the report as JSON here")
    c.add_argument("--markdown", dest="md_out", type=Path, help="write the report as a Markdown table here")
    c.add_argument("--drain", action="store_true", help="drain this node in Slurm when a check fails")
    c.add_argument(
        "--from-dir", type=Path, help="read captured outputs from this directory (no commands run)"
    )
    c.set_defaults(func=run_check)
    return p


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def drain(report: Report, runner: collect.Runner = collect.run) -> str:
    """scontrol update NodeName=<node> State=DRAIN Reason=...; returns what happened (one line)."""
    reason = report.drain_reason()
    out = runner(["scontrol", "update", f"NodeName={report.node}", "State=DRAIN", f"Reason={reason}"], 30.0)
    if out.text is None:
        return f"could not drain {report.node}: {out.error}"
    return f"drained {report.node}: {reason}"


def run_check(ns: argparse.Namespace) -> int:
    try:
        exp = load(ns.expect)
    except ExpectError as e:
        print(f"lcm-runner health check: {e}", file=sys.stderr)
        return 2
    if ns.from_dir is not None and not ns.from_dir.is_dir():
        print(f"lcm-runner health check: --from-dir {ns.from_dir}: not a directory", file=sys.stderr)
        return 2
    raw = collect.from_dir(ns.from_dir) if ns.from_dir is not None else collect.collect(exp)
    report = evaluate(exp, raw)
    for c in report.checks:
        print(c.line())
    print(report.verdict, flush=True)
    try:
        if ns.json_out:
            _write(ns.json_out, report.to_json())
        if ns.md_out:
            _write(ns.md_out, report.to_markdown())
    except OSError as e:
        print(f"lcm-runner health check: cannot write the report: {e}", file=sys.stderr)
        return 2
    if not report.healthy and ns.drain:
        print(drain(report), file=sys.stderr)
    return 0 if report.healthy else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="lcm-runner")
    add_parser(ap.add_subparsers(dest="command", required=True))
    ns = ap.parse_args(argv)
    return int(ns.func(ns))


if __name__ == "__main__":
    raise SystemExit(main())
