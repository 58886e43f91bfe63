"""PNG plots of a run (matplotlib, Agg): step time, per-rank loss, the kill/recovery timeline, the SLOs.

Each plot is drawn only from data the run holds; a plot without data is not drawn (its reason is
returned), never filled with invented points.

Over ~300 lines: one function per plot, each self-contained; splitting them would only scatter the figure
styling.
"""

from __future__ import annotations

import statistics
import textwrap
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from lcm_runner import telemetry
from lcm_runner.report.slo import FAIL, PASS, Row, fmt

COLORS = plt.get_cmap("tab10").colors


def _job_records(records: list[telemetry.Record], job_ids: list[str]) -> list[telemetry.Record]:
    ids = {str(j) for j in job_ids}
    return [r for r in records if r.job in ids]


def step_time(records: list[telemetry.Record], out: Path, title: str) -> str | None:
    steps = telemetry.steps(records)
    if not steps:
        return "no step records"
    fig, ax = plt.subplots(figsize=(10, 4.8), dpi=110)
    by_rank: dict[int, list[telemetry.Record]] = defaultdict(list)
    for r in steps:
        by_rank[r.rank].append(r)
    for i, (rank, rs) in enumerate(sorted(by_rank.items())):
        xs = [r.step for r in rs]
        ys = [float(r.get("step_time_s") or 0) * 1000 for r in rs]
        ax.plot(xs, ys, marker="o", ms=3, lw=1.2, color=COLORS[i % 10], alpha=0.85, label=f"rank {rank}")
    rank0 = [float(r.get("step_time_s") or 0) * 1000 for r in by_rank.get(min(by_rank), [])]
    if len(rank0) > 2:
        mean = statistics.fmean(rank0[1:])
        ax.axhline(
            mean,
            color="black",
            ls="--",
            lw=1,
            label=f"mean (rank {min(by_rank)}, after step 1) {mean:.1f} ms",
        )
    ckpts = sorted({int(r.step or 0) for r in telemetry.of_event(records, "ckpt_end")})
    for j, s in enumerate(ckpts):
        ax.axvline(s, color="tab:gray", ls=":", lw=1.2, label="checkpoint" if j == 0 else None)
    ax.set_xlabel("step")
    ax.set_ylabel("step time (ms)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize=8, ncol=2)
    all_ms = [float(r.get("step_time_s") or 0) * 1000 for r in steps]
    steady = sorted(float(r.get("step_time_s") or 0) * 1000 for r in steps if (r.step or 0) > 1)
    top = steady[int(0.99 * (len(steady) - 1))] * 2.0 if steady else 0.0
    if top and max(all_ms) > top:  # the warm-up step would flatten everything else: clip and label it
        ax.set_ylim(0, top)
        for r in steps:
            ms = float(r.get("step_time_s") or 0) * 1000
            if ms > top and r.rank == min(by_rank):
                ax.annotate(
                    f"step {r.step}: {ms:.0f} ms (off scale)",
                    xy=(r.step, top),
                    xytext=(0, -14),
                    textcoords="offset points",
                    ha="left",
                    fontsize=8,
                    arrowprops={"arrowstyle": "->"},
                )
    else:
        ax.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return None


def loss_per_rank(records: list[telemetry.Record], out: Path, title: str) -> str | None:
    steps = [r for r in telemetry.steps(records) if isinstance(r.get("loss"), int | float)]
    if not steps:
        return "no step records with a loss"
    fig, (ax, ax2) = plt.subplots(
        2, 1, figsize=(10, 6.2), dpi=110, sharex=True, gridspec_kw={"height_ratios": [3, 1.2]}
    )
    by_rank: dict[int, dict[int, float]] = defaultdict(dict)
    for r in steps:
        by_rank[r.rank][int(r.step or 0)] = float(r.get("loss"))
    styles = ["-", "--", "-.", ":"]
    for i, (rank, losses) in enumerate(sorted(by_rank.items())):
        xs = sorted(losses)
        ax.plot(
            xs, [losses[x] for x in xs], ls=styles[i % 4], lw=1.6, color=COLORS[i % 10], label=f"rank {rank}"
        )
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=4)
    all_steps = sorted({s for losses in by_rank.values() for s in losses})
    spread = [
        max(v[s] for v in by_rank.values() if s in v) - min(v[s] for v in by_rank.values() if s in v)
        for s in all_steps
    ]
    ax2.plot(all_steps, spread, color="tab:red", marker=".", lw=1)
    ax2.set_ylabel("max - min\nacross ranks")
    ax2.set_xlabel("step")
    ax2.grid(alpha=0.3)
    ax2.set_ylim(bottom=0, top=max(max(spread) * 1.2, 1e-6))
    if max(spread) == 0:
        ax2.annotate(
            "identical on every rank (spread 0)", xy=(0.5, 0.5), xycoords="axes fraction", ha="center"
        )
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return None


KILL_WORDS = ("SIGKILL", "cancelled")  # the resume stage's kill event (older runs: a cancel)


def _case_windows(stages: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """(name, kill ts, recovered ts, job ids) per fault case and the resume cycle, from stage events."""
    out: list[dict[str, Any]] = []
    fault = stages.get("fault")
    if fault:
        events = [e for e in fault.get("events", []) if isinstance(e, dict)]
        for name, case in fault.get("metrics", {}).items():
            if not isinstance(case, dict):
                continue
            mine = [e for e in events if str(e.get("what", "")).startswith(f"{name}:")]
            kill = next(
                (e["ts"] for e in mine if any(k in e["what"] for k in ("kill -9", "lost", "fresh launch"))),
                None,
            )
            back = next((e["ts"] for e in mine if "first new step" in e["what"]), None)
            out.append(
                {
                    "name": name,
                    "kill": kill,
                    "back": back,
                    "jobs": case.get("job_ids", []),
                    "downtime": case.get("downtime_s"),
                    "error": case.get("error", ""),
                }
            )
    resume = stages.get("resume")
    if resume:
        ev = [e for e in resume.get("events", []) if isinstance(e, dict)]
        kill = next((e["ts"] for e in ev if any(k in str(e.get("what", "")) for k in KILL_WORDS)), None)
        back = next((e["ts"] for e in ev if "first new step" in str(e.get("what", ""))), None)
        out.append(
            {
                "name": "resume (SIGKILL of every rank + resubmit)",
                "kill": kill,
                "back": back,
                "jobs": resume.get("job_ids", []),
                "downtime": resume.get("metrics", {}).get("resume_s"),
                "error": "",
            }
        )
    return out


def timeline(records: list[telemetry.Record], stages: dict[str, dict[str, Any]], out: Path) -> str | None:
    cases = [c for c in _case_windows(stages) if c["kill"] is not None]
    if not cases:
        return "no fault or resume cycle recorded (stages fault/resume did not run)"
    fig, axes = plt.subplots(len(cases), 1, figsize=(10, 2.3 * len(cases) + 0.8), dpi=110, squeeze=False)
    for ax, c in zip(axes[:, 0], cases, strict=True):
        t0 = float(c["kill"])
        recs = telemetry.reporting_steps(_job_records(records, c["jobs"]))
        before = [r for r in recs if r.ts <= t0]
        after = [r for r in recs if r.ts > t0]
        ax.scatter(
            [r.ts - t0 for r in before],
            [r.step for r in before],
            s=10,
            color="tab:blue",
            label="steps before",
        )
        ax.scatter(
            [r.ts - t0 for r in after], [r.step for r in after], s=10, color="tab:green", label="steps after"
        )
        ax.axvline(0, color="tab:red", lw=2, label="kill / cancel / launch")
        if c["back"] is not None:
            dt = float(c["back"]) - t0
            ax.axvspan(0, dt, color="tab:red", alpha=0.12)
            ax.axvline(dt, color="tab:green", lw=1.5, ls="--", label="first new step")
            ax.annotate(
                f"downtime {dt:.2f} s",
                xy=(dt / 2, 0.85),
                xycoords=("data", "axes fraction"),
                ha="center",
                va="center",
                fontsize=10,
                fontweight="bold",
                bbox={"boxstyle": "round", "fc": "white", "ec": "tab:red", "alpha": 0.9},
            )
        if not recs:
            ax.annotate(
                "no telemetry steps for this case's jobs",
                xy=(0.5, 0.75),
                xycoords="axes fraction",
                ha="center",
                fontsize=8,
                color="tab:gray",
            )
        if c["error"]:
            ax.annotate(
                "no recovery:\n" + textwrap.fill(str(c["error"]), 100),
                xy=(0.02, 0.45),
                xycoords="axes fraction",
                va="center",
                fontsize=8,
                color="tab:red",
            )
        ax.set_title(c["name"], loc="left", fontsize=10)
        ax.set_ylabel("step")
        ax.set_ylim(bottom=0, top=max([r.step or 0 for r in recs] + [1]) * 1.1)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("seconds since the kill (fresh launch for the floor)")
    axes[0, 0].legend(fontsize=7, loc="upper left", ncol=4)
    fig.suptitle("Kill and recovery timeline (rank 0 steps)")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return None


def slo_chart(rows: list[Row], out: Path) -> str | None:
    rated = [r for r in rows if r.value is not None and r.target]
    if not rated:
        return "no measured SLO with a target"
    fig, ax = plt.subplots(figsize=(10, 0.55 * len(rated) + 1.4), dpi=110)
    ratios = [float(r.value) / float(r.target) for r in rated]  # type: ignore[arg-type]
    colors = [
        "tab:green" if r.status == PASS else "tab:red" if r.status == FAIL else "tab:gray" for r in rated
    ]
    y = list(range(len(rated)))[::-1]
    ax.barh(y, ratios, color=colors)
    ax.axvline(1.0, color="black", lw=1.2, ls="--")
    for yi, r, q in zip(y, rated, ratios, strict=True):
        ax.text(
            q + 0.01,
            yi,
            f"{fmt(r.value, r.unit)} / {fmt(r.target, r.unit)}  {r.status}",
            va="center",
            fontsize=8,
        )
    ax.set_yticks(y, [r.label for r in rated], fontsize=8)
    ax.set_xlabel("measured / target (<= 1 meets the SLO)")
    ax.set_xlim(0, max(1.25, max(ratios) * 1.45))
    ax.set_title("SLOs")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return None


def draw_all(
    run_dir: Path, records: list[telemetry.Record], stages: dict[str, dict[str, Any]], rows: list[Row]
) -> dict[str, str]:
    """Write plots/*.png; returns {name: path or 'not drawn: why'}."""
    d = run_dir / "plots"
    d.mkdir(parents=True, exist_ok=True)
    base = stages.get("baseline")
    base_recs = _job_records(records, base.get("job_ids", [])) if base else []
    jobs = ", ".join(map(str, base.get("job_ids", []))) if base else ""
    results: dict[str, str] = {}
    plan = [
        (
            "step_time.png",
            lambda p: (
                step_time(base_recs, p, f"Per-step time, baseline job {jobs}")
                if base
                else "stage baseline did not run"
            ),
        ),
        (
            "loss_per_rank.png",
            lambda p: (
                loss_per_rank(base_recs, p, f"Loss per rank, baseline job {jobs}")
                if base
                else "stage baseline did not run"
            ),
        ),
        ("fault_timeline.png", lambda p: timeline(records, stages, p)),
        ("slo.png", lambda p: slo_chart(rows, p)),
    ]
    for name, fn in plan:
        path = d / name
        why = fn(path)
        results[name] = str(path) if why is None else f"not drawn: {why}"
        if why is not None and path.exists():
            path.unlink()  # a stale plot of an earlier report must not pass for this one
    return results
