"""Summarise benchmarks/ckpt_load_ab.sh: each cold resume's time (`load_s`, the whole resume; `verify_s`
its verification), the median per side, their ratio, and each side's read rate against dd's direct read.

    python3 benchmarks/ckpt_load_ab.py OUTDIR      # writes OUTDIR/summary.json
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path


def resume(run: Path) -> dict | None:
    for f in sorted((run / "telemetry").glob("*.jsonl")):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            if r.get("event") == "resume" and r.get("rank") == 0:
                return {"verify_s": r["verify_s"], "load_s": r["load_s"], "step": r["step"]}
    return None


def checkpoint_bytes(outdir: Path) -> int | None:
    for f in sorted((outdir / "save" / "telemetry").glob("*.jsonl")):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            if r.get("event") == "ckpt_end" and r.get("rank") == 0:
                return int(r["bytes"])
    return None


def summarise(outdir: Path) -> dict:
    nbytes = checkpoint_bytes(outdir)
    disk = outdir / "disk.txt"  # dd's last line: "... copied, 4.2 s, 1.3 GB/s"
    m = re.search(r"([0-9.,]+) ([GM])B/s", disk.read_text()) if disk.is_file() else None
    direct = float(m[1].replace(",", ".")) * (1 if m[2] == "G" else 1e-3) if m else None
    out: dict = {"bytes": nbytes, "direct_read_gbps": direct, "runs": {}, "sides": {}}
    for run in sorted(p for p in outdir.iterdir() if p.is_dir() and p.name != "save"):
        if (r := resume(run)) is not None:
            out["runs"][run.name] = r
    for side in ("baseline", "current"):
        runs = [r for n, r in out["runs"].items() if n.startswith(side + "-")]
        if not runs:
            continue
        s = {
            "n": len(runs),
            "load_s_median": statistics.median(r["load_s"] for r in runs),
            "verify_s_median": statistics.median(r["verify_s"] for r in runs),
        }
        if nbytes:
            s["read_gbps"] = round(nbytes / 1e9 / s["load_s_median"], 3)
            if direct:
                s["of_direct_read"] = round(s["read_gbps"] / direct, 3)
        out["sides"][side] = s
    if {"baseline", "current"} <= set(out["sides"]):
        b, c = out["sides"]["baseline"], out["sides"]["current"]
        out["current_over_baseline"] = round(c["load_s_median"] / b["load_s_median"], 3)
    return out


def main(argv: list[str]) -> int:
    outdir = Path(argv[1])
    s = summarise(outdir)
    (outdir / "summary.json").write_text(json.dumps(s, indent=2) + "\n")
    print(json.dumps(s, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
