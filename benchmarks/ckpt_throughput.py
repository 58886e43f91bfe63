"""Summarise benchmarks/ckpt_throughput.sh: the disk's direct-I/O bandwidth beside the checkpoints, and each
save/load of the trainer as a ratio of it (issue 17's targets: write >= 70% of direct write, async blocking
<= 5% of the synchronous save, load >= 70% of direct read).

    python3 benchmarks/ckpt_throughput.py OUTDIR      # writes OUTDIR/summary.json and OUTDIR/summary.md

Figures come from the trainer's own telemetry (ckpt_end: bytes, blocking_s, total_s, hash_s; resume:
verify_s, load_s: load_s is the whole resume, verify_s its first part, the verification before the
read). The save figure is the second save of each run (step 4: the first also pays
one-time costs, shown beside it). GB = 1e9 bytes, as dd prints.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

TARGET_WRITE = 0.70
TARGET_READ = 0.70
TARGET_ASYNC_BLOCKING = 0.05
_UNIT = {"GB/s": 1.0, "MB/s": 1e-3}


def disk(outdir: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in (outdir / "disk.txt").read_text().splitlines():
        m = re.fullmatch(r"(\w+) ([0-9.,]+) ([GM]B/s)", line.strip())
        if m:
            out[m[1] + "_gbps"] = round(float(m[2].replace(",", ".")) * _UNIT[m[3]], 3)
    return out


def from_console(call: Path) -> dict | None:
    """The figures of a call that did not reach its summary (cut short): the telemetry lines the script
    printed to console.log (cut at 260 characters, so read field by field), as summarise() shapes them:
    {"disk", "saves": {run: ...} (second save of each run), "loads": {run: ...}}."""
    log = call / "console.log"
    if not log.is_file() or not (call / "disk.txt").is_file():
        return None

    def num(key: str, line: str) -> float:
        return float(re.search(rf'"{key}":([0-9.]+)', line)[1])  # type: ignore[index]

    saves: dict[str, dict] = {}
    loads: dict[str, dict] = {}
    run = ""
    for line in log.read_text().splitlines():
        if line.startswith("=== "):
            run = line.split()[1]
        elif '"event":"ckpt_end"' in line and '"step":4,' in line:
            b, t = num("bytes", line), num("total_s", line)
            saves[run] = {
                "bytes": b,
                "total_s": t,
                "blocking_s": num("blocking_s", line),
                "asynchronous": '"asynchronous":true' in line,
                "write_gbps": b / 1e9 / t,
            }
        elif '"event":"resume"' in line:
            loads[run] = {"verify_s": num("verify_s", line), "load_s": num("load_s", line)}
    for name, ld in loads.items():
        src = saves.get("sync-" + name.split("-", 1)[1])
        if src:
            ld["bytes"] = src["bytes"]
            ld["read_gbps"] = src["bytes"] / 1e9 / ld["load_s"]  # load_s includes verify_s
    return {"disk": disk(call), "saves": saves, "loads": loads}


def records(run: Path) -> list[dict]:
    recs: list[dict] = []
    for f in sorted((run / "telemetry").glob("rank*.jsonl")):
        recs += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return recs


def save_run(run: Path) -> dict | None:
    ends = {r["step"]: r for r in records(run) if r.get("event") == "ckpt_end" and r.get("rank") == 0}
    if 4 not in ends:
        return None
    last, first = ends[4], ends.get(2)
    gb = last["bytes"] / 1e9
    out = {
        "bytes": last["bytes"],
        "asynchronous": last["asynchronous"],
        "total_s": last["total_s"],
        "blocking_s": last["blocking_s"],
        "write_gbps": round(gb / last["total_s"], 3),
        "hash_s": last.get("hash_s", {}),
    }
    if first is not None:
        out["first_save"] = {"total_s": first["total_s"], "blocking_s": first["blocking_s"]}
    return out


def load_run(run: Path, nbytes: int) -> dict | None:
    res = [r for r in records(run) if r.get("event") == "resume" and r.get("rank") == 0]
    if not res:
        return None
    r = res[-1]
    read_s = r["load_s"]  # the whole resume; verify_s is a part of it, not an addition
    return {
        "bytes": nbytes,
        "verify_s": r["verify_s"],
        "load_s": r["load_s"],
        "read_s": round(read_s, 3),
        "read_gbps": round(nbytes / 1e9 / read_s, 3),
    }


def summarise(outdir: Path) -> dict:
    d = disk(outdir)
    saves = {p.name: s for p in sorted(outdir.iterdir()) if p.is_dir() and (s := save_run(p))}
    for s in saves.values():
        if "direct_write_gbps" in d:
            s["of_direct_write"] = round(s["write_gbps"] / d["direct_write_gbps"], 3)
    loads = {}
    for p in sorted(outdir.glob("load-w*")):
        src = saves.get("sync-" + p.name.split("-", 1)[1])
        if src and (ld := load_run(p, src["bytes"])):
            if "direct_read_gbps" in d:
                ld["of_direct_read"] = round(ld["read_gbps"] / d["direct_read_gbps"], 3)
            loads[p.name] = ld
    sync = {k: v for k, v in saves.items() if not v["asynchronous"]}
    best = max(sync, key=lambda k: sync[k]["write_gbps"]) if sync else None
    for k, v in saves.items():
        ref = sync.get("sync-" + k.rsplit("-", 1)[-1]) if v["asynchronous"] else None
        if ref:
            v["blocking_of_sync_save"] = round(v["blocking_s"] / ref["total_s"], 4)
    env = (outdir / "env.txt").read_text() if (outdir / "env.txt").is_file() else ""
    return {
        "env": env.strip().splitlines(),
        "disk": d,
        "saves": saves,
        "loads": loads,
        "best_sync": best,
        "targets": {
            "write_of_direct": TARGET_WRITE,
            "read_of_direct": TARGET_READ,
            "async_blocking_of_sync": TARGET_ASYNC_BLOCKING,
        },
    }


def markdown(s: dict) -> str:
    d = s["disk"]
    lines = [
        "# Checkpoint throughput (benchmarks/ckpt_throughput.sh)",
        "",
        *[f"    {e}" for e in s["env"]],
        "",
        f"Disk beside the checkpoints (dd, 16 MiB blocks): direct write {d.get('direct_write_gbps')} GB/s, "
        f"direct read {d.get('direct_read_gbps')} GB/s, buffered + fdatasync write "
        f"{d.get('buffered_fdatasync_write_gbps')} GB/s.",
        "",
        "| run | GB | save s (2nd) | blocking s | GB/s | of direct write | async blocking of sync "
        "| 1st save s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for k, v in s["saves"].items():
        lines.append(
            f"| {k} | {v['bytes'] / 1e9:.2f} | {v['total_s']:.2f} | {v['blocking_s']:.3f} | "
            f"{v['write_gbps']:.3f} | {v.get('of_direct_write', '')} | "
            f"{v.get('blocking_of_sync_save', '')} | "
            f"{v.get('first_save', {}).get('total_s', '')} |"
        )
    lines += [
        "",
        "| load | verify s (part of the load) | load s (the whole resume) | GB/s | of direct read |",
        "|---|---|---|---|---|",
    ]
    for k, v in s["loads"].items():
        lines.append(
            f"| {k} | {v['verify_s']:.2f} | {v['load_s']:.2f} | {v['read_gbps']:.3f} | "
            f"{v.get('of_direct_read', '')} |"
        )
    t = s["targets"]
    lines += [
        "",
        f"Targets: write >= {t['write_of_direct']:.0%} of direct write, load >= {t['read_of_direct']:.0%} of "
        f"direct read, async blocking <= {t['async_blocking_of_sync']:.0%} of the synchronous save.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    outdir = Path(argv[0])
    s = summarise(outdir)
    (outdir / "summary.json").write_text(json.dumps(s, indent=2) + "\n")
    (outdir / "summary.md").write_text(markdown(s))
    print(markdown(s))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
