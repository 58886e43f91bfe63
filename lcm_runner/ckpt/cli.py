"""`lcm-runner ckpt verify <dir>`: check a checkpoint directory offline, one line per checkpoint.

Exit 0 when `latest` names a checkpoint that verifies and no complete checkpoint is damaged; 1 when a
checkpoint is damaged or `latest` names one that does not verify; 2 when the directory is not there or
holds no checkpoint at all (no iter_*/, no latest_checkpointed_iteration.txt: not a save directory).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .catalog import CatalogError, newest_known_good, read_latest, scan


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    p = subparsers.add_parser("ckpt", help="checkpoint tools: verify a save directory offline")
    sub = p.add_subparsers(dest="ckpt_command", required=True, metavar="ckpt-command")
    v = sub.add_parser(
        "verify",
        help="check every checkpoint of a save directory against its recorded checksums",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    v.add_argument("dir", help="the save directory (holding iter_*/ and latest_checkpointed_iteration.txt)")
    v.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    v.set_defaults(func=run_verify)
    return p


def run_verify(ns: argparse.Namespace) -> int:
    d = Path(ns.dir)
    if not d.is_dir():
        print(f"lcm-runner ckpt verify: {d}: not a directory", file=sys.stderr)
        return 2
    try:
        latest = read_latest(d)
    except CatalogError as e:
        latest, latest_problem = None, str(e)
    else:
        latest_problem = ""
    entries = scan(d, verify=True)
    if not entries and latest is None and not latest_problem:
        print(
            f"lcm-runner ckpt verify: {d}: no checkpoint (no iter_*/ directory, no "
            "latest_checkpointed_iteration.txt): not a save directory",
            file=sys.stderr,
        )
        return 2
    by_step = {e.step: e for e in entries}
    good = newest_known_good(d)
    damaged = [e for e in entries if e.state == "damaged"]
    if latest is not None and latest not in by_step:
        latest_problem = f"latest names step {latest}, which has no directory"
    elif latest is not None and by_step[latest].state not in ("verified", "legacy"):
        latest_problem = f"latest names step {latest}, which is {by_step[latest].state}"
    elif latest is None and not latest_problem and any(e.state != "incomplete" for e in entries):
        latest_problem = "no latest_checkpointed_iteration.txt although complete checkpoints exist"
    ok = not damaged and not latest_problem
    if ns.json:
        print(
            json.dumps(
                {
                    "dir": str(d),
                    "latest": latest,
                    "newest_known_good": good,
                    "ok": ok,
                    "problem": latest_problem,
                    "checkpoints": [
                        {
                            "step": e.step,
                            "state": e.state,
                            "detail": e.detail,
                            "known_good": e.known_good,
                            "rejected": e.rejected,
                        }
                        for e in entries
                    ],
                },
                indent=2,
            )
        )
        return 0 if ok else 1
    print(f"{d}: {len(entries)} checkpoint(s), latest {latest}, newest known-good {good}")
    for e in entries:
        print(f"  {e.line(latest)}")
    if latest_problem:
        print(f"PROBLEM: {latest_problem}")
    print(f"VERDICT: {'OK' if ok else 'DAMAGED'}" + (f" ({len(damaged)} damaged)" if damaged else ""))
    return 0 if ok else 1
