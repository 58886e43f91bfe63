"""Write the dashboards' JSON (roles/grafana/files/dashboards/<uid>.json) and docs/dashboards.md
(scripts/gen-dashboards). --check: write nothing, exit 1 naming each stale, missing or extra file."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from grafana_foundation_sdk.cog.encoder import JSONEncoder

from . import DASHBOARDS
from .common import Dashboard, render
from .docs import render_docs

JSON_DIR = Path("roles/grafana/files/dashboards")
DOCS = Path("docs/dashboards.md")


def dashboard_json(d: Dashboard) -> str:
    """Deterministic: keys sorted, ids by position (common.panels_by_id)."""
    return json.dumps(render(d), cls=JSONEncoder, sort_keys=True, indent=2) + "\n"


def outputs(root: Path = Path(".")) -> dict[Path, str]:
    """Every generated file (under root) and its content."""
    files = {root / JSON_DIR / f"{d.uid}.json": dashboard_json(d) for d in DASHBOARDS}
    files[root / DOCS] = render_docs(DASHBOARDS)
    return files


def problems(root: Path = Path(".")) -> list[str]:
    """What --check reports: files that differ from a fresh build, and JSONs no dashboard makes (the
    Grafana role would provision them too)."""
    want = outputs(root)
    out = [
        f"{p} is stale" if p.exists() else f"{p} is missing"
        for p, text in want.items()
        if not p.exists() or p.read_text(encoding="utf-8") != text
    ]
    extra = sorted(set((root / JSON_DIR).glob("*.json")) - set(want))
    return out + [f"{p} is not made by any dashboard" for p in extra]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gen-dashboards", description=__doc__)
    ap.add_argument("--root", default=".", help="repository root (default: the current directory)")
    ap.add_argument("--check", action="store_true", help="exit 1 if any output differs, write nothing")
    args = ap.parse_args(argv)
    root = Path(args.root)
    if args.check:
        found = problems(root)
        for line in found:
            print(f"{line}: run scripts/gen-dashboards", file=sys.stderr)
        return 1 if found else 0
    want = outputs(root)
    for p in sorted(set((root / JSON_DIR).glob("*.json")) - set(want)):
        p.unlink()
        print(f"removed {p}")
    for p, text in want.items():
        p.parent.mkdir(parents=True, exist_ok=True)
        if not p.exists() or p.read_text(encoding="utf-8") != text:
            p.write_text(text, encoding="utf-8")
            print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
