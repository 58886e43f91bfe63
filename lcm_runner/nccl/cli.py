"""The parser half of `lcm-runner nccl-profile`: `--parse-only <dir>` reads logs already written.

`python -m lcm_runner.nccl <dir> [--inventory inventories/<name>] [--json out.json]` does the same.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from lcm_runner.nccl import profile_dir


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("log_dir", help="directory of nccl.%%h.%%p.log files (a run's nccl/)")
    p.add_argument("--inventory", "-i", help="check against this cluster spec (inventories/<name>)")
    p.add_argument("--json", dest="json_out", help="also write the summary as JSON here")


def format_summary(s: dict[str, Any]) -> str:
    lines = [
        f"NCCL logs: {s['files']} file(s) in {s.get('directory', '?')}; expected inter-node "
        f"{s['expect']['inter_node'] or 'n/a'}, "
        f"NVLink inside nodes: {'yes' if s['expect']['nvlink'] else 'no'}"
    ]
    for r in s["ranks"]:
        t = ", ".join(f"{k} x{n}" for k, n in r["transports"].items()) or "none"
        lines.append(
            f"  rank {r['rank']} ({r['host']}:{r['pid']} dev {r['cuda_dev']}): NCCL {r['nccl_version']}, "
            f"net {r['net_plugin']}, comms {r['communicators']}, transports {t}"
            + (f", GDR {'on' if r['gdr'] else 'off'}" if r["gdr"] is not None else "")
        )
        for coll, algos in r["algos"].items():
            lines.append(f"    {coll}: " + ", ".join(f"{a} x{n}" for a, n in algos.items()))
    for f in s["flags"]:
        lines.append(f"  [{f['severity'].upper()}] {f['code']}: {f['detail']}")
    lines.append("verdict: " + ("PASS" if s["ok"] else "FAIL") + f" ({len(s['flags'])} flag(s))")
    return "\n".join(lines)


def run(ns: argparse.Namespace) -> int:
    cluster = None
    if ns.inventory:
        from lcm_runner.config import load_cluster

        cluster = load_cluster(ns.inventory)
    try:
        summary = profile_dir(ns.log_dir, cluster)
    except FileNotFoundError as exc:
        print(f"nccl-profile: {exc}", file=sys.stderr)
        return 2
    print(format_summary(summary))
    if ns.json_out:
        Path(ns.json_out).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return 0 if summary["ok"] else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lcm_runner.nccl", description=__doc__)
    add_arguments(ap)
    return run(ap.parse_args(argv))
