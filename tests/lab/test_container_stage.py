"""A training stage inside the lab's training image: `lcm-runner baseline --container-image
/shared/images/lcm-train.sqsh` on the lab controller (real Slurm, Pyxis, Enroot, two CPU nodes).

The image is the one playbooks/image.yml built (roles/train_image); every job step of the stage is an
Enroot container that Pyxis starts from it (docs/containers.md). Checked: the stage passes, its batch
script names the image and the mounts, and every rank's start event records an Enroot root filesystem
(lcm_runner.train.procutil.root_mount), so the ranks really ran inside the container.
Run from the host: `pytest -m lab tests/lab/test_container_stage.py` (molecule verify runs it).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from labrun import (
    FORCED,
    LAB,
    LAB_IMAGE,
    RUNNER,
    SHARED_HOST,
    SPEC,
    lab_builds_image,
    lab_exec,
    printed_run_dir,
    unavailable,
)

from lcm_runner.telemetry import load_run, of_event
from lcm_runner.train.procutil import in_enroot_container

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def container_run() -> tuple[Path, str]:
    if not ((LAB / "READY").exists() or FORCED) or shutil.which("podman") is None:
        unavailable("the lab is not up (.lab/READY missing; LCM_LAB=1 forces)")
    if not lab_builds_image():
        pytest.skip("the lab inventory builds no training image (layers.pyxis / train_image_build off)")
    if not (SHARED_HOST / LAB_IMAGE.removeprefix("/shared/")).exists():
        pytest.fail(f"the lab builds the training image but {LAB_IMAGE} is missing (playbooks/image.yml)")
    ci = SHARED_HOST / "ci"
    ci.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "configs" / "lab.yml", ci / "lab-container.yml")
    p = lab_exec(
        RUNNER,
        "baseline",
        "-c",
        "/shared/ci/lab-container.yml",
        "-i",
        SPEC,
        "--runs-root",
        "/shared/runs",
        "--container-image",
        LAB_IMAGE,
        "--timeout",
        "600",
        timeout=900,
    )
    print(p.stdout[-8000:], p.stderr[-3000:])
    run_dir = printed_run_dir(p)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    return run_dir, p.stdout


def test_the_baseline_stage_passes_inside_the_training_image(container_run: tuple[Path, str]) -> None:
    run_dir, _out = container_run
    stage = json.loads((run_dir / "stages" / "baseline.json").read_text())
    assert stage["verdict"] == "PASS", stage["summary"]
    scripts = sorted((run_dir / "sbatch").glob("*.sbatch"))
    assert scripts
    for script in scripts:
        text = script.read_text()
        assert f"--container-image={LAB_IMAGE}" in text, script.name
        assert "/etc/slurm:/etc/slurm:ro" in text and "/run/munge:/run/munge" in text, script.name


def test_every_rank_ran_inside_an_enroot_container(container_run: tuple[Path, str]) -> None:
    run_dir, _ = container_run
    starts = of_event(load_run(run_dir), "start")
    assert len(starts) == 4, [(s.rank, s.get("host")) for s in starts]  # 2 nodes x 2 ranks, one job
    assert {s.get("host") for s in starts} == {"lab-node1", "lab-node2"}
    outside = [
        (s.get("host"), s.rank, s.get("rootfs"))
        for s in starts
        if not in_enroot_container(str(s.get("rootfs")))
    ]
    assert not outside, outside
