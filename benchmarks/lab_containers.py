"""Containerised training on the lab (docs/containers.md): collect a `lcm-runner all --container-image`
run into docs/results/lab-containers/, with the training image's manifest and a timed container start.

    python benchmarks/lab_containers.py RUN_DIR [--label squashfuse] [--starts 3] [--out DIR]

RUN_DIR is the run directory seen from the host (.lab/shared/runs/<id>). Writes <out>/<label>/ (the run's
infra_slo.md, slo.json, stages/*.json) and <out>/<label>.json: the stage verdicts and the figures the
README quotes, each copied from the run's own files, plus `container_start_s` (wall time of
`srun -N1 --container-image=<image> true` on lab-ctl, `--starts` times, measured now) and the image's
manifest (size, files, build seconds).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT / ".lab" / "shared"
IMAGE = "/shared/images/lcm-train.sqsh"


def _stage(run: Path, name: str) -> dict[str, Any]:
    return json.loads((run / "stages" / f"{name}.json").read_text(encoding="utf-8"))


def _floor(run: Path, fault: dict[str, Any]) -> float:
    """The floor case's downtime; where the case failed after measuring it (its cleanup kill, fixed
    since), the same span from the stage's own events: the fresh launch -> its first new step."""
    if fault["floor"].get("downtime_s") is not None:
        return round(fault["floor"]["downtime_s"], 2)
    ev = {
        e["what"].split(" ")[1]: e["ts"]
        for e in _stage(run, "fault")["events"]
        if e["what"].startswith("floor:")
    }
    return round(ev["first"] - ev["fresh"], 2)


def _starts(n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.monotonic()
        p = subprocess.run(
            [
                "podman",
                "exec",
                "lab-ctl",
                "bash",
                "-c",
                f"cd /tmp && srun -N1 --container-image={IMAGE} true",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if p.returncode != 0:
            raise SystemExit(f"container start failed: {p.stderr[-500:]}")
        out.append(round(time.monotonic() - t, 2))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--label", default="squashfuse")
    ap.add_argument("--starts", type=int, default=3, help="timed container starts (0: none)")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "lab-containers")
    a = ap.parse_args()
    run = a.run_dir.resolve()
    dest = a.out / a.label
    (dest / "stages").mkdir(parents=True, exist_ok=True)
    for name in ("infra_slo.md", "slo.json"):
        shutil.copy(run / name, dest / name)
    for f in (run / "stages").glob("*.json"):
        shutil.copy(f, dest / "stages" / f.name)
    fault = _stage(run, "fault")["metrics"]
    link = SHARED / "images" / "lcm-train.sqsh"
    manifest = json.loads(link.resolve().with_suffix(".json").read_text(encoding="utf-8"))
    slo = json.loads((run / "slo.json").read_text(encoding="utf-8"))
    summary = {
        "run": run.name,
        "image": {k: manifest[k] for k in ("key", "sha256", "bytes", "files", "build_s", "compression")},
        "verdicts": {k: v["verdict"] for k, v in slo["stages"].items()},
        "report_verdict": slo["verdict"],
        "containers_note": next((s for s in slo.get("stops", []) if s.startswith("containers:")), ""),
        "baseline_step_ms": round(_stage(run, "baseline")["metrics"]["step_time_mean_s"] * 1e3, 1),
        "resume_s": round(_stage(run, "resume")["metrics"]["resume_s"], 2),
        "floor_s": _floor(run, fault),
        "trainer_kill_s": round(fault["trainer_kill"]["downtime_s"], 2),
        "node_loss_s": round(fault["node_loss"]["downtime_s"], 2),
        "leftover_processes": {
            k: fault[k].get("leftover_processes") for k in ("floor", "trainer_kill", "node_loss")
        },
        "container_start_s": _starts(a.starts) if a.starts else [],
    }
    (a.out / f"{a.label}.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
