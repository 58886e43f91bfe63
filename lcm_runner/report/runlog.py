"""multi_node_run.log: an abbreviated, time-ordered log of a run.

Per-step times (rank 0), NCCL communicator inits and transports (the NCCL logs of the run), checkpoint
cycles, and the fault cycles (kills, restarts, resumes) with UTC timestamps, merged from the trainer's
telemetry and the stages' event lists. Events every rank emits at once (start, exit, checkpoint) are
folded into one line naming the ranks.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from lcm_runner import telemetry
from lcm_runner.contracts import EVENT_STEP

FOLDED = ("start", "ckpt_begin", "ckpt_end", "resume", "signal", "exit")


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _ranks(rs: list[int]) -> str:
    rs = sorted(set(rs))
    if rs and rs == list(range(rs[0], rs[-1] + 1)) and len(rs) > 2:
        return f"ranks {rs[0]}-{rs[-1]}"
    return ("rank " if len(rs) == 1 else "ranks ") + ",".join(map(str, rs))


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _describe(event: str, rec: telemetry.Record) -> str:
    d = rec.data
    if event == "start":
        keys = ("world_size", "tp", "pp", "ep", "dp", "resumed_from")
        return "start " + " ".join(f"{k}={_fmt(d[k])}" for k in keys if k in d)
    if event == "ckpt_begin":
        return f"checkpoint begin step {d.get('step')}"
    if event == "ckpt_end":
        size = d.get("bytes")
        mb = f", {float(size) / 1e6:.1f} MB" if isinstance(size, int | float) else ""
        return (
            f"checkpoint end step {d.get('step')}: total {_fmt(d.get('total_s'))}s, "
            f"blocking {_fmt(d.get('blocking_s'))}s{mb}"
        )
    if event == "resume":
        return f"resume from step {d.get('step')} (load {_fmt(d.get('load_s'))}s)"
    if event == "signal":
        return f"signal {d.get('name')}"
    if event == "exit":
        reason = " ".join(str(d.get("reason", "")).split())
        return f"exit code {d.get('code')} ({reason[:120]}{'...' if len(reason) > 120 else ''})"
    return event + " " + " ".join(f"{k}={_fmt(v)}" for k, v in d.items())


def telemetry_lines(records: list[telemetry.Record]) -> list[tuple[float, str]]:
    lines: list[tuple[float, str]] = []
    groups: dict[tuple[Any, ...], list[telemetry.Record]] = defaultdict(list)
    step_rank: dict[str, int] = {}  # job -> its reporting rank (telemetry.step_rank)
    for r in records:
        if r.event == EVENT_STEP:
            step_rank[r.job] = min(step_rank.get(r.job, r.rank), r.rank)
    for r in records:
        if r.event == EVENT_STEP:
            if r.rank == step_rank[r.job]:
                comm = r.get("comm_time_s")
                comm_s = f" comm {comm * 1000:.1f} ms" if isinstance(comm, int | float) else ""
                lines.append(
                    (
                        r.ts,
                        f"job {r.job} attempt {r.attempt}  step {r.step} loss {_fmt(r.get('loss'))} "
                        f"step_time {float(r.get('step_time_s') or 0) * 1000:.1f} ms{comm_s}",
                    )
                )
        elif r.event in FOLDED:
            groups[(r.event, r.job, r.attempt, r.get("step"), r.get("code"), r.get("name"))].append(r)
        else:
            lines.append((r.ts, f"job {r.job} attempt {r.attempt}  rank {r.rank} {_describe(r.event, r)}"))
    for (event, job, attempt, *_), recs in groups.items():
        first = min(recs, key=lambda x: x.ts)
        span = max(x.ts for x in recs) - first.ts
        spread = f" (+{span:.2f}s across ranks)" if span >= 0.01 else ""
        lines.append(
            (
                first.ts,
                f"job {job} attempt {attempt}  {_ranks([x.rank for x in recs])} "
                f"{_describe(event, first)}{spread}",
            )
        )
    return lines


def stage_lines(stages: dict[str, dict[str, Any]]) -> list[tuple[float, str]]:
    lines: list[tuple[float, str]] = []
    for name, st in stages.items():
        if isinstance(st.get("started"), int | float):
            lines.append((float(st["started"]), f"[{name}] stage started"))
        for ev in st.get("events", []):
            if isinstance(ev, dict) and isinstance(ev.get("ts"), int | float):
                lines.append((float(ev["ts"]), f"[{name}] {ev.get('what', '')}"))
        if isinstance(st.get("ended"), int | float) and st.get("ended"):
            lines.append((float(st["ended"]), f"[{name}] {st.get('verdict', '?')}: {st.get('summary', '')}"))
    return lines


def nccl_lines(nccl: dict[str, Any] | None) -> list[str]:
    if not nccl:
        return ["NCCL: no NCCL logs in this run (CPU/gloo run, or nccl-profile not run)"]
    out = [
        f"NCCL: {nccl.get('files', 0)} process log(s); "
        f"network plugin(s) {', '.join(nccl.get('net_plugins', [])) or '-'}"
    ]
    for r in nccl.get("ranks", []):
        transports = ", ".join(f"{k} x{n}" for k, n in r.get("transports", {}).items()) or "none"
        out.append(
            f"  rank {r.get('rank')} {r.get('host')}:{r.get('pid')} NCCL {r.get('nccl_version')}: "
            f"{r.get('communicators')} communicator init(s), net {r.get('net_plugin')}, "
            f"transports {transports}"
        )
        for coll, algos in r.get("algos", {}).items():
            out.append(f"    {coll}: " + ", ".join(f"{a} x{n}" for a, n in algos.items()))
    for f in nccl.get("flags", []):
        out.append(f"  [{str(f.get('severity', '')).upper()}] {f.get('code')}: {f.get('detail')}")
    out.append(
        f"NCCL profile verdict: {'PASS' if nccl.get('ok') else 'FAIL'} ({len(nccl.get('flags', []))} flag(s))"
    )
    return out


def render(
    run_dir: Path,
    records: list[telemetry.Record],
    stages: dict[str, dict[str, Any]],
    nccl: dict[str, Any] | None,
    skipped_lines: int = 0,
) -> str:
    head = [
        f"# multi_node_run.log: {run_dir}",
        "# times are UTC; steps shown for rank 0; all-rank events folded",
    ]
    if skipped_lines:
        head.append(f"# {skipped_lines} truncated telemetry line(s) skipped (writers killed mid-line)")
    head += nccl_lines(nccl)
    head.append("")
    merged = sorted(telemetry_lines(records) + stage_lines(stages), key=lambda x: x[0])
    body = [f"{iso(ts)}  {text}" for ts, text in merged]
    if not body:
        body = ["(no telemetry and no stage results in this run directory)"]
    return "\n".join(head + body) + "\n"
