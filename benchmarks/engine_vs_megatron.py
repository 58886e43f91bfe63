"""Summarise benchmarks/engine_vs_megatron.sh: median step (steps 5..N), tokens/s and communication share
of each run, each engine run's ratio to Megatron-LM's, and the attention core.

    python3 benchmarks/engine_vs_megatron.py OUTDIR     # writes OUTDIR/summary.json, OUTDIR/summary.md
    python3 benchmarks/engine_vs_megatron.py --markdown-only OUTDIR   # summary.md from summary.json
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

FIRST = 5  # steps before it are warm-up (CUDA context, allocator, first kernels)
TOKENS_PER_STEP = 2 * 4096  # global batch 2 x sequence 4096
ENGINE_RUNS = ("engine-unfused", "engine-flash", "engine-bare", "engine-grouped", "engine-flash-grouped")
REQUIRED = ("engine-unfused", "engine-flash", "engine-bare")  # the later two: runs of this script since 12-02
ITER = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*?elapsed time per iteration \(ms\): ([0-9.]+)")


def engine_run(d: Path) -> dict | None:
    f = d / "telemetry" / "rank0.jsonl"
    if not f.is_file():
        return None
    recs = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    steps = [r for r in recs if r.get("event") == "step" and r.get("step", 0) >= FIRST]
    if not steps:
        return None
    t = [r["step_time_s"] for r in steps]
    out = {"steps": len(steps), "median_step_ms": round(statistics.median(t) * 1000, 2)}
    comm = [r["comm_time_s"] / r["step_time_s"] for r in steps if "comm_time_s" in r]
    if comm:
        out["comm_share"] = round(statistics.median(comm), 4)
        per: dict[str, list[float]] = {}
        for r in steps:
            for k, v in (r.get("comm") or {}).items():
                per.setdefault(k, []).append(v / r["step_time_s"])
        out["comm_share_by_collective"] = {k: round(statistics.median(v), 4) for k, v in sorted(per.items())}
    start = next((r for r in recs if r.get("event") == "start"), {})
    out["attention"] = start.get("attention")
    out["experts"] = start.get("experts") or "sequential"
    every = [r for r in recs if r.get("event") == "step"]
    # one step's loss is noisy (global batch 2): the mean of the last 10 steps compares runs
    out["loss_first"] = every[0].get("loss")
    tail = [r["loss"] for r in every[-10:] if r.get("loss") is not None]
    out["loss_mean_last10"] = round(statistics.fmean(tail), 6) if tail else None
    return out


def megatron_run(log: Path) -> dict | None:
    if not log.is_file():
        return None
    t = [float(ms) for it, ms in ITER.findall(log.read_text(errors="replace")) if int(it) >= FIRST]
    if not t:
        return None
    return {
        "steps": len(t),
        "median_step_ms": round(statistics.median(t), 2),
        "attention": "unfused",
        "experts": "sequential",
    }


def main(outdir: Path) -> int:
    runs: dict[str, dict | None] = {
        name: engine_run(outdir / name)
        for name in ENGINE_RUNS
        if (outdir / name).is_dir() or name in REQUIRED
    }
    runs["megatron-lm"] = megatron_run(outdir / "megatron-lm.log")
    ref = (runs.get("megatron-lm") or {}).get("median_step_ms")
    for r in runs.values():
        if r:
            r["tokens_per_s"] = round(TOKENS_PER_STEP / (r["median_step_ms"] / 1000))
            if ref:
                r["ratio_to_megatron_lm"] = round(r["median_step_ms"] / ref, 3)
                r["speedup_over_megatron_lm"] = round(ref / r["median_step_ms"], 3)
    att = outdir / "attention.json"
    summary = {
        "runs": runs,
        "attention_core": json.loads(att.read_text()) if att.is_file() else None,
        "env": (outdir / "env.txt").read_text() if (outdir / "env.txt").is_file() else "",
    }
    (outdir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return write_markdown(outdir, summary, ok=all(runs.values()))


def write_markdown(outdir: Path, summary: dict, ok: bool = True) -> int:
    runs = summary["runs"]
    lines = [
        "| run | attention | experts | median step (ms) | tokens/s | comm share | step / Megatron-LM's "
        "| loss step 1, mean of the last 10 |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, r in runs.items():
        if not r:
            lines.append(f"| {name} | - | - | did not run | | | | |")
            continue
        share = f"{r['comm_share'] * 100:.1f} %" if "comm_share" in r else "not measured"
        ratio = f"{r['ratio_to_megatron_lm']:.3f}x" if "ratio_to_megatron_lm" in r else "-"
        loss = (
            f"{r['loss_first']:.6f}, {r['loss_mean_last10']:.4f}"
            if r.get("loss_mean_last10") is not None
            else "-"
        )
        lines.append(
            f"| {name} | {r['attention']} | {r.get('experts', 'sequential')} | {r['median_step_ms']:.1f} "
            f"| {r['tokens_per_s']:,} | {share} | {ratio} | {loss} |"
        )
    a = summary["attention_core"]
    if a:
        fb = a["fwd_bwd"]
        lines += [
            "",
            f"Attention core alone ({a['shape']}, {a['dtype']}, fwd + bwd): "
            f"unfused {fb['unfused']['median_ms']} ms, "
            f"SDPA {fb['sdpa']['median_ms']} ms ({a['speedup']}x); max |difference| output "
            f"{a['difference']['out_max_abs']:.3g}, gradients {a['difference']['grad_max_abs']:.3g}.",
        ]
    (outdir / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["--markdown-only"]:  # re-render summary.md from a fetched summary.json
        d = Path(sys.argv[2])
        sys.exit(write_markdown(d, json.loads((d / "summary.json").read_text())))
    sys.exit(main(Path(sys.argv[1])))
