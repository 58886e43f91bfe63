"""Summarise benchmarks/restart_paths.sh: per case, fault -> first new step and its phases.

    python benchmarks/restart_paths.py OUTDIR   # writes OUTDIR/summary.json and OUTDIR/summary.md

Phases from the trainer's telemetry (lcm_runner.contracts): fault (the injected kill's console line, or
the `fault` event), start of the new attempt (process, CUDA and process group ready), resume (its load_s:
verify + load), the first step of the new attempt (its step_time_s is the first step's own cost).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from lcm_runner.telemetry import load_run, of_event, steps

KILL = re.compile(r"fault injection: SIGKILL at step \d+ t=([0-9.]+)")
REENTRY = re.compile(r"in-process restart 1 begins t=([0-9.]+)")  # NVRx called the trainer again
CASES = ("agent_kill", "agent_raise", "inprocess", "inprocess_fast", "agent_kill_warm", "agent_raise_warm")


def case(d: Path) -> dict:
    recs = load_run(d)
    fault = of_event(recs, "fault", rank=0)
    log = d / "console.log"
    text = log.read_text(errors="replace") if log.is_file() else ""
    m = KILL.search(text)
    reentry = REENTRY.search(text)
    t_fault = fault[0].ts if fault else (float(m.group(1)) if m else None)
    if t_fault is None:
        return {"error": "no fault recorded"}
    after = [r for r in recs if r.ts > t_fault and r.rank == 0]
    start = next((r for r in after if r.event == "start"), None)
    resume = next((r for r in after if r.event == "resume"), None)
    # the fault is injected in attempt 0 in every case: the recovery's first step is a later attempt's
    # (attempt 0's last step record may be written after the fault's timestamp)
    first = next((r for r in steps(after, rank=0) if r.attempt > 0), None)
    if first is None:
        return {"error": "no step after the fault"}
    agent = _agent_events(d)
    failure = next((e for e in agent if e["event"] == "failure" and e["ts"] >= t_fault - 0.01), None)
    respawn = next((e for e in agent if e["event"] == "spawn" and e.get("gen", 0) > 0), None)
    out = {
        "fault_to_first_step_s": round(first.ts - t_fault, 3),
        # the agent saw the rank's exit (waitpid: after the kernel tore the dead process down)
        "fault_to_detected_s": round(failure["ts"] - t_fault, 3) if failure else None,
        "fault_to_spawn_s": round(respawn["ts"] - t_fault, 3) if respawn else None,
        "warm": respawn.get("warm") if respawn else None,
        "fault_to_start_s": round(start.ts - t_fault, 3) if start else None,
        "fault_to_reentry_s": round(float(reentry.group(1)) - t_fault, 3) if reentry else None,
        "resume_load_s": resume.get("load_s") if resume else None,
        "resume_verify_s": resume.get("verify_s") if resume else None,
        "first_step_time_s": first.get("step_time_s"),
        "same_pid": None,
        "resumed_from": resume.step if resume else None,
        "resume_source": resume.get("source") if resume else None,
        "startup": start.get("startup") if start else None,
        "attempt": first.attempt,
    }
    pids = [r.get("pid") for r in of_event(recs, "start", rank=0)]
    if len(pids) >= 2:
        out["same_pid"] = pids[0] == pids[-1]
    return out


def _agent_events(d: Path) -> list[dict]:
    p = d / "agent.jsonl"
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()] if p.is_file() else []


def main(argv: list[str]) -> int:
    outdir = Path(argv[1])
    res = {name: case(outdir / name) for name in CASES if (outdir / name).is_dir()}
    (outdir / "summary.json").write_text(json.dumps(res, indent=2) + "\n")
    head = "| case | fault -> first new step | -> trainer re-entered | -> new start | resume load "
    lines = [head + "| first step | same process |", "|---|---|---|---|---|---|---|"]
    for name, r in res.items():
        if "error" in r:
            lines.append(f"| {name} | {r['error']} | | | | | |")
            continue
        lines.append(
            f"| {name} | {r['fault_to_first_step_s']:.2f} s | {r['fault_to_reentry_s']} s "
            f"| {r['fault_to_start_s']} s | {r['resume_load_s']} s | {r['first_step_time_s']} s "
            f"| {r['same_pid']} |"
        )
    (outdir / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
