#!/usr/bin/env python3
"""Measure converge times of site.yml on the lab (docs/lab.md, "Measured times").

    python benchmarks/converge.py --fresh   # lab absent -> site.yml (fresh), then site.yml again (no-op)
    python benchmarks/converge.py --fresh --strategies linear,mitogen_linear   # both, each fresh + no-op
    python benchmarks/converge.py --fresh --compute-nodes 2,8   # the lab with 2, then 8 compute nodes
    python benchmarks/converge.py --fresh --module-cache off,on   # without, then with the nodes' module cache
    python benchmarks/converge.py           # no-op re-converges of the running lab only (non-destructive)

Each case ends with two no-op runs: `noop` with -e lcm_converge_full=true (every role runs and reports ok),
then `unchanged`, the plain re-run that site.yml's unchanged check skips (playbooks/unchanged.yml).

Each converge runs `ansible-playbook site.yml` with the ansible.posix.json stdout callback; the play recap
(ok/changed/failed per host) and per-task durations come from that JSON. The result is written to
benchmarks/results/converge-<UTC time>.json and printed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"


@dataclass
class Converge:
    """One timed ansible-playbook run."""

    name: str
    playbook: str
    seconds: float
    rc: int
    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: int = 0
    per_host: dict[str, dict[str, int]] = field(default_factory=dict)
    changed_tasks: list[str] = field(default_factory=list)
    slowest_tasks: list[dict[str, Any]] = field(default_factory=list)


def _parse_time(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def summarize(name: str, playbook: str, seconds: float, rc: int, report: dict[str, Any]) -> Converge:
    """Recap counts, changed tasks and the slowest tasks from an ansible.posix.json report."""
    result = Converge(name=name, playbook=playbook, seconds=round(seconds, 1), rc=rc)
    for host, stats in report.get("stats", {}).items():
        counts = {k: int(stats.get(k, 0)) for k in ("ok", "changed", "failures", "unreachable", "skipped")}
        result.per_host[host] = counts
        result.ok += counts["ok"]
        result.changed += counts["changed"]
        result.failed += counts["failures"]
        result.unreachable += counts["unreachable"]
    durations: list[dict[str, Any]] = []
    for play in report.get("plays", []):
        for task in play.get("tasks", []):
            info = task.get("task", {})
            hosts = task.get("hosts", {})
            for host, res in hosts.items():
                if res.get("changed"):
                    result.changed_tasks.append(f"{host}: {info.get('name', '?')}")
            duration = info.get("duration", {})
            if duration.get("start") and duration.get("end"):
                spent = _parse_time(duration["end"]) - _parse_time(duration["start"])
                durations.append({"task": info.get("name", "?"), "seconds": round(spent, 2)})
    result.slowest_tasks = sorted(durations, key=lambda d: d["seconds"], reverse=True)[:10]
    return result


def parse_report(stdout: str) -> dict[str, Any]:
    """The ansible.posix.json document in a playbook's stdout (other callbacks may print around it)."""
    match = re.search(r"^\{", stdout, re.M)
    if not match:
        return {}
    try:
        report, _ = json.JSONDecoder().raw_decode(stdout, match.start())
    except ValueError:
        return {}
    return report if isinstance(report, dict) else {}


def strategy_env(strategy: str) -> dict[str, str]:
    """ANSIBLE_STRATEGY (and the plugin path for mitogen's strategies, when mitogen is installed)."""
    if strategy == "linear":
        return {}
    env = {"ANSIBLE_STRATEGY": strategy}
    if strategy.startswith("mitogen"):
        try:
            import ansible_mitogen  # type: ignore[import-not-found]
        except ImportError:
            raise SystemExit(f"--strategies {strategy}: mitogen is not installed") from None
        env["ANSIBLE_STRATEGY_PLUGINS"] = str(Path(ansible_mitogen.__file__).parent / "plugins" / "strategy")
    return env


def run_playbook(
    name: str, args: list[str], log_dir: Path, extra_env: dict[str, str] | None = None
) -> Converge:
    env = dict(
        os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="ansible.posix.json"
    )
    env["ANSIBLE_CALLBACKS_ENABLED"] = "ansible.posix.timer"
    env.update(extra_env or {})
    started = time.monotonic()
    proc = subprocess.run(
        ["ansible-playbook", *args], cwd=REPO, env=env, capture_output=True, text=True, check=False
    )
    seconds = time.monotonic() - started
    (log_dir / f"{name}.json").write_text(proc.stdout, encoding="utf-8")
    if proc.stderr:
        (log_dir / f"{name}.stderr").write_text(proc.stderr, encoding="utf-8")
    result = summarize(name, " ".join(args), seconds, proc.returncode, parse_report(proc.stdout))
    print(
        f"[converge] {name}: {result.seconds} s, rc={result.rc}, "
        f"changed={result.changed}, failed={result.failed}",
        file=sys.stderr,
    )
    return result


def lab_leftovers() -> list[str]:
    """What a lab.yml state=absent should have removed but did not (containers, network, .lab/)."""
    left: list[str] = []
    ps = subprocess.run(
        ["podman", "ps", "--all", "--filter", "label=lcm.lab=node", "--format", "{{.Names}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    left += [f"container {name}" for name in ps.stdout.split()]
    if subprocess.run(["podman", "network", "exists", "lcm-lab"], check=False).returncode == 0:
        left.append("network lcm-lab")
    if (REPO / ".lab").exists():
        left.append(".lab/")
    return left


def git_revision() -> str:
    proc = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False)
    return proc.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--fresh", action="store_true", help="destroy the lab first and time a fresh converge (destructive)"
    )
    parser.add_argument("--playbook", default="site.yml", help="playbook to converge (default: site.yml)")
    parser.add_argument(
        "--output", type=Path, help="result file (default: benchmarks/results/converge-<UTC>.json)"
    )
    parser.add_argument(
        "--strategies",
        default="linear",
        help="comma-separated strategies, each timed in turn in this run: its no-op converge (with --fresh, "
        "first a fresh one) (e.g. linear,mitogen_linear; mitogen must be installed)",
    )
    parser.add_argument(
        "--label",
        default="",
        help="prefix of the run names (<label>:noop, ...), e.g. a baseline of other roles measured in the "
        "same session; docs/performance.md reads the unlabelled runs only",
    )
    parser.add_argument(
        "--compute-nodes",
        default="",
        help="with --fresh: comma-separated lab compute node counts, each converged fresh + no-op in turn "
        "(LAB_COMPUTE_NODES; runs named fresh-c<n>, noop-c<n>), e.g. 2,8 for the scale ratio",
    )
    parser.add_argument(
        "--module-cache",
        default="",
        help="comma-separated off/on: each case in turn with -e common_module_cache=<false|true> "
        "(roles/common's bytecode cache for module payloads on the nodes; runs without it named "
        "<run>-nocache), e.g. off,on for the ratio of one run; default: the spec's setting, no suffix",
    )
    options = parser.parse_args(argv)
    caches = [c.strip() for c in options.module_cache.split(",") if c.strip()]
    if any(c not in ("off", "on") for c in caches):
        parser.error(f"--module-cache takes off and/or on, got {options.module_cache!r}")
    prefix = f"{options.label}:" if options.label else ""
    counts = [int(c) for c in options.compute_nodes.split(",") if c.strip()]
    if counts and not options.fresh:
        parser.error("--compute-nodes needs --fresh (each count starts from an absent lab)")

    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    log_dir = RESULTS / f"converge-{stamp}.logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    runs: list[Converge] = []
    leftovers: list[str] | None = None
    # --fresh: each strategy (and node count) in turn destroys the lab, converges it fresh and then once more
    strategies = options.strategies.split(",")
    cases = [(s, c, m) for s in strategies for c in (counts or [None]) for m in (caches or [None])]
    for strategy, count, cache in cases:
        suffix = ("" if strategy == "linear" else f"-{strategy}") + (f"-c{count}" if count else "")
        suffix += "-nocache" if cache == "off" else ""
        env = strategy_env(strategy) | ({"LAB_COMPUTE_NODES": str(count)} if count else {})
        extra = ["-e", f"common_module_cache={'true' if cache == 'on' else 'false'}"] if cache else []
        if options.fresh:
            absent = ["playbooks/lab.yml", "-e", "state=absent"]
            runs.append(run_playbook(f"{prefix}absent{suffix}", absent, log_dir, env))
            leftovers = (leftovers or []) + lab_leftovers()
            runs.append(run_playbook(f"{prefix}fresh{suffix}", [options.playbook, *extra], log_dir, env))
        # noop: every role runs (the unchanged check off); unchanged: the plain re-run, which the unchanged
        # check (playbooks/unchanged.yml) skips when the inputs and every node are as the last converge left
        # them
        full = [options.playbook, "-e", "lcm_converge_full=true", *extra]
        runs.append(run_playbook(f"{prefix}noop{suffix}", full, log_dir, env))
        runs.append(run_playbook(f"{prefix}unchanged{suffix}", [options.playbook, *extra], log_dir, env))

    result = {
        "benchmark": "converge",
        "time": stamp,
        "git_revision": git_revision(),
        "playbook": options.playbook,
        "nodes": sorted(h for h in runs[-1].per_host if h != "localhost"),
        "strategies": options.strategies.split(","),
        "compute_nodes": counts,
        "module_cache": caches,
        "label": options.label,
        "runs": [asdict(r) for r in runs],
        "noop_changed": runs[-1].changed,
        "absent_leftovers": leftovers,
        "ok": all(r.rc == 0 for r in runs)
        and all(r.changed == 0 for r in runs if r.name.removeprefix(prefix).startswith(("noop", "unchanged")))
        and not leftovers,
    }
    output = options.output or RESULTS / f"converge-{stamp}.json"
    output.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=2))
    print(f"[converge] written {output}", file=sys.stderr)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
