"""Numbers of run_h200.sh from the trainer's telemetry: summarize.py WORK_DIR OUT.json

For each configuration directory (g1, g2ep2): step time and tokens/s of the reference run (steps >= 4,
median and p90), the fraction of step time in the gradient all-reduce (comm_time_s), checkpoint save
(sync: the reference's final save; async: blocking vs total), load time, and the continuation check:
the resumed run's losses against the uninterrupted run's at the same steps, plus run-to-run
reproducibility (reference vs first part, same steps, no checkpoint involved).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from lcm_runner.telemetry import Record, load_run, of_event, steps


def _load(tel: Path) -> list[Record]:
    # load_run expects <run>/telemetry; our dirs are <cfg>/telemetry-<name>
    tmp = tel.parent / f".view-{tel.name}"
    tmp.mkdir(exist_ok=True)
    link = tmp / "telemetry"
    if not link.exists():
        link.symlink_to(tel.resolve())
    return load_run(tmp)


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-30)


def summarize_config(cfg: Path) -> dict:
    runs = {
        n: _load(cfg / f"telemetry-{n}")
        for n in ("ref", "part1", "part2")
        if (cfg / f"telemetry-{n}").is_dir()
    }
    out: dict = {"runs": sorted(runs)}
    ref = runs.get("ref", [])
    ref_steps = steps(ref, rank=0)
    if ref_steps:
        start = of_event(ref, "start", rank=0)[0]
        out["world_size"], out["ep"], out["dp"] = start.get("world_size"), start.get("ep"), start.get("dp")
        out["num_params_per_rank"] = start.get("num_params")
        out["optimizer_impl"], out["transformer_impl"] = (
            start.get("optimizer_impl"),
            start.get("transformer_impl"),
        )
        warm = [r for r in ref_steps if r.step >= 4]
        st = sorted(r.get("step_time_s") for r in warm)
        out["steps"] = len(ref_steps)
        out["step_time_median_s"] = statistics.median(st)
        out["step_time_p90_s"] = st[int(0.9 * (len(st) - 1))]
        out["step1_time_s"] = ref_steps[0].get("step_time_s")
        out["tokens_per_s_median"] = statistics.median(r.get("tokens_per_s") for r in warm)
        comm = [r.get("comm_time_s") / r.get("step_time_s") for r in warm if r.get("comm_time_s") is not None]
        out["comm_fraction_median"] = statistics.median(comm) if comm else None
        out["loss_first"], out["loss_last"] = ref_steps[0].get("loss"), ref_steps[-1].get("loss")
        out["ref_losses"] = {r.step: r.get("loss") for r in ref_steps}
        ends = of_event(ref, "ckpt_end", rank=0)
        if ends:
            out["sync_save"] = {k: ends[-1].get(k) for k in ("step", "blocking_s", "total_s", "bytes")}
            out["sync_save"]["GB_per_s"] = ends[-1].get("bytes") / ends[-1].get("total_s") / 1e9
    p1 = runs.get("part1", [])
    if p1:
        out["async_saves"] = [
            {k: r.get(k) for k in ("step", "blocking_s", "total_s", "bytes", "asynchronous")}
            for r in of_event(p1, "ckpt_end", rank=0)
        ]
        p1_steps = {r.step: r.get("loss") for r in steps(p1, rank=0)}
        ref_l = {r.step: r.get("loss") for r in ref_steps}
        common = sorted(set(p1_steps) & set(ref_l))
        if common:
            out["run_to_run_max_rel_diff"] = max(_rel(p1_steps[s], ref_l[s]) for s in common)
            out["run_to_run_bitwise_equal_steps"] = sum(p1_steps[s] == ref_l[s] for s in common)
            out["run_to_run_steps_compared"] = len(common)
        k = max((r.step for r in of_event(p1, "ckpt_end", rank=0) if r.step), default=None)
        after = [r for r in steps(p1, rank=0) if k and r.step > int(out["async_saves"][0]["step"])]
        if after and warm:
            out["step_time_median_while_async_write_s"] = statistics.median(
                r.get("step_time_s") for r in after
            )
    p2 = runs.get("part2", [])
    if p2:
        res = of_event(p2, "resume", rank=0)
        if res:
            out["resume"] = {"step": res[0].step, "load_s": res[0].get("load_s")}
            starts = of_event(p2, "start", rank=0)
            first = [r for r in steps(p2, rank=0)]
            if starts and first:
                out["resume"]["process_start_to_first_new_step_s"] = first[0].ts - starts[0].ts
                out["resume"]["first_new_step"] = first[0].step
                out["resume"]["first_step_time_s"] = first[0].get("step_time_s")
        ref_l = {r.step: r.get("loss") for r in ref_steps}
        cont = {r.step: r.get("loss") for r in steps(p2, rank=0)}
        common = sorted(set(cont) & set(ref_l))
        if common:
            diffs = {s: _rel(cont[s], ref_l[s]) for s in common}
            out["continuation"] = {
                "steps": [common[0], common[-1]],
                "first_step_rel_diff": diffs[common[0]],
                "max_rel_diff": max(diffs.values()),
                "bitwise_equal_steps": sum(cont[s] == ref_l[s] for s in common),
                "target_rel": 1e-3,
                "pass": max(diffs.values()) <= 1e-3,
                "resumed_losses": cont,
            }
    return out


def main() -> int:
    work, dest = Path(sys.argv[1]), Path(sys.argv[2])
    result = {
        c.name: summarize_config(c)
        for c in sorted(work.iterdir())
        if c.is_dir() and not c.name.startswith(".")
    }
    dest.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    for name, r in result.items():
        brief = {k: v for k, v in r.items() if k not in ("ref_losses",)}
        if "continuation" in brief:
            brief["continuation"] = {k: v for k, v in brief["continuation"].items() if k != "resumed_losses"}
        print(name, json.dumps(brief, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
