"""The fault matrix's table: rows recorded by tests/faults (JSON lines) -> the Markdown of
docs/reliability.md.

    python -m lcm_runner.report.faults matrix.jsonl [--out table.md]

One row per fault (the last recorded one when a fault ran twice): fault | injected how | detected after
| recovered | downtime | steps lost beyond the last checkpoint | good checkpoints lost.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

COLUMNS = (
    "Fault",
    "Injected how",
    "Detected after",
    "Recovered",
    "Downtime",
    "Steps lost beyond the last checkpoint",
    "Good checkpoints lost",
    "Notes",
)


def load_rows(path: Path) -> list[dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            raise ValueError(f"{path}:{n}: not JSON: {e}") from e
        rows[row["fault"]] = row
    return list(rows.values())


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f} s"


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def table(rows: list[dict[str, Any]]) -> str:
    out = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        cells = (
            r["fault"],
            r["injected"],
            _s(r.get("detected_s")),
            "yes" if r.get("recovered") else "no (stops, by design)",
            _s(r.get("downtime_s")),
            r.get("steps_lost", "-"),
            r.get("good_ckpts_lost", "-"),
            r.get("notes", ""),
        )
        out.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    bad = [r["fault"] for r in rows if r.get("steps_lost") or r.get("good_ckpts_lost")]
    out.append("")
    out.append(
        "Every row: 0 steps lost beyond the last good checkpoint, 0 good checkpoints lost."
        if not bad
        else f"LOSS in: {', '.join(bad)}"
    )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lcm_runner.report.faults", description=__doc__)
    ap.add_argument("results", type=Path, help="matrix.jsonl written by tests/faults")
    ap.add_argument("--out", type=Path, help="write the table here (default: stdout)")
    ns = ap.parse_args(argv)
    try:
        text = table(load_rows(ns.results))
    except (OSError, ValueError, KeyError) as e:
        print(f"{ap.prog}: {e}", file=sys.stderr)
        return 2
    if ns.out:
        ns.out.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
