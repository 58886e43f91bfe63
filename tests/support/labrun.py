"""The lab's end-to-end run, shared by the lab tests (tests/lab): `lcm-runner all --launcher slurm` on the
podman lab's controller, run once per pytest session (the root conftest's session fixture
`lab_run_result`), so the stage tests and the monitoring tests (training metrics in Prometheus, the
dashboards' queries) read the same run.

It needs the lab up (`.lab/READY`), Slurm answering on lab-ctl and the runner installed there
(playbooks/runner.yml: /opt/lcm/venv, /opt/lcm/cluster.yml). The run config is the repo's
configs/lab.yml, copied into the lab's shared directory; the results are read back from it.

LCM_LAB_CONTAINER_IMAGE=<image> runs every job of it inside that image (`--container-image`,
docs/containers.md; e.g. the lab's training image /shared/images/lcm-train.sqsh); by default the jobs run
on the nodes directly, and tests/lab/test_container_stage.py runs a containerised stage of its own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
LAB = Path(os.environ.get("LCM_LAB_DIR", ROOT / ".lab"))
SHARED_HOST = LAB / "shared"  # the lab's /shared, seen from the host
CTL = os.environ.get("LCM_LAB_CONTROLLER", "lab-ctl")
RUNNER = os.environ.get("LCM_LAB_RUNNER", "/opt/lcm/venv/bin/lcm-runner")
SPEC = os.environ.get("LCM_LAB_SPEC", "/opt/lcm/cluster.yml")
TIMEOUT_S = int(os.environ.get("LCM_LAB_TIMEOUT_S", "1800"))


INVENTORY = ROOT / "inventories" / "lab" / "group_vars" / "all"
LAB_IMAGE = "/shared/images/lcm-train.sqsh"  # roles/train_image's link, seen from the lab nodes


def container_image() -> str | None:
    """The image the lab's `all` run uses: LCM_LAB_CONTAINER_IMAGE, else none (jobs on the nodes)."""
    return os.environ.get("LCM_LAB_CONTAINER_IMAGE") or None


def lab_builds_image() -> bool:
    """Whether the lab inventory has Pyxis and builds the training image (the default lab)."""
    spec = yaml.safe_load((INVENTORY / "cluster.yml").read_text(encoding="utf-8"))["cluster"]
    lab = yaml.safe_load((INVENTORY / "lab.yml").read_text(encoding="utf-8"))
    return bool(spec["layers"].get("pyxis") and lab.get("train_image_build"))


def lab_exec(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", "exec", CTL, *argv], capture_output=True, text=True, timeout=timeout, check=False
    )


FORCED = os.environ.get("LCM_LAB") == "1"  # molecule verify sets it: a missing lab is then a failure


def unavailable(why: str) -> None:
    if FORCED:
        pytest.fail(f"LCM_LAB=1 but {why}")
    pytest.skip(why)


@dataclass(frozen=True)
class LabRun:
    dir: Path
    returncode: int
    out: str
    container_image: str | None = None


def printed_run_dir(p: subprocess.CompletedProcess[str]) -> Path:
    """The host path of the run dir an lcm-runner command on the lab printed ("run dir: /shared/...")."""
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("run dir: ")), None)
    assert line, f"no run dir printed (exit {p.returncode}) on {CTL}: {p.stderr[-2000:]}"
    run_dir = SHARED_HOST / Path(line.split(": ", 1)[1]).relative_to("/shared")
    assert run_dir.is_dir(), run_dir
    return run_dir


def run_lab_all() -> LabRun:
    """`lcm-runner all --launcher slurm` on the lab controller; fails or skips when it cannot run."""
    if not ((LAB / "READY").exists() or FORCED) or shutil.which("podman") is None:
        unavailable("the lab is not up (.lab/READY missing; LCM_LAB=1 forces)")
    if lab_exec("sinfo", "-h").returncode != 0:
        unavailable("Slurm does not answer on the lab controller")
    if lab_exec("test", "-x", RUNNER).returncode != 0:
        unavailable(f"{RUNNER} is not installed on {CTL} (playbooks/runner.yml)")
    image = container_image()
    if image and image.startswith("/shared/") and not (SHARED_HOST / image.removeprefix("/shared/")).exists():
        pytest.fail(f"the lab builds the training image but {image} is missing (playbooks/image.yml)")
    ci = SHARED_HOST / "ci"
    ci.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "configs" / "lab.yml", ci / "lab.yml")
    p = lab_exec(
        RUNNER,
        "all",
        "-c",
        "/shared/ci/lab.yml",
        "-i",
        SPEC,
        "--launcher",
        "slurm",
        "--runs-root",
        "/shared/runs",
        "--step-sleep-ms",
        "30",
        "--timeout",
        "600",
        *(["--container-image", image] if image else []),
        timeout=TIMEOUT_S,
    )
    print(p.stdout[-20000:], p.stderr[-5000:])
    run_dir = printed_run_dir(p)
    return LabRun(run_dir, p.returncode, p.stdout[-3000:] + p.stderr[-3000:], image)
