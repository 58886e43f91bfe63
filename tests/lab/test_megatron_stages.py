"""A foreign trainer through every stage on the lab's real Slurm: `lcm-runner all -c configs/lab-megatron.yml`
(`workload: megatron-lm`), the user's `pretrain_gpt.py` run unchanged through the runner's bridge.

Megatron-LM's training loop needs CUDA; the CPU lab runs tests/support/fake_megatron, which speaks
Megatron-LM core_v0.19.0's flags, console lines, torch_dist checkpoint layout and exit-signal handling
(its own tests: tests/unit/test_fake_megatron.py). Checked: every stage's verdict, that the ranks really
ran the foreign script (Megatron's checkpoint layout, no file of the project's trainer, Megatron's
iteration lines in the rank logs), that the step records come from the last rank as Megatron prints
them, that no log line was dropped, and that the runner says which arguments it added.
Run from the host: `pytest -m lab tests/lab/test_megatron_stages.py` (molecule verify runs it).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from labrun import FORCED, LAB, RUNNER, SHARED_HOST, SPEC, lab_exec, printed_run_dir, unavailable

from lcm_runner.ckpt.integrity import COMPLETE_MARKER
from lcm_runner.contracts import EVENT_LOG_PARSE, EVENT_STEP, LATEST_FILE
from lcm_runner.telemetry import load_run, of_event

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
FAKE = ROOT / "tests" / "support" / "fake_megatron"


@pytest.fixture(scope="module")
def megatron_run() -> tuple[Path, str]:
    if not ((LAB / "READY").exists() or FORCED) or shutil.which("podman") is None:
        unavailable("the lab is not up (.lab/READY missing; LCM_LAB=1 forces)")
    if lab_exec("test", "-x", RUNNER).returncode != 0:
        unavailable(f"{RUNNER} is not installed on the lab (playbooks/runner.yml)")
    dest = SHARED_HOST / "fake_megatron"
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(FAKE, dest, ignore=shutil.ignore_patterns("__pycache__"))
    ci = SHARED_HOST / "ci"
    ci.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "configs" / "lab-megatron.yml", ci / "lab-megatron.yml")
    p = lab_exec(
        RUNNER, "all", "-c", "/shared/ci/lab-megatron.yml", "-i", SPEC, "--runs-root", "/shared/runs",
        "--timeout", "600", timeout=1800,
    )  # fmt: skip
    print(p.stdout[-10000:], p.stderr[-3000:])
    run_dir = printed_run_dir(p)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    return run_dir, p.stdout


def _stage(run_dir: Path, name: str) -> dict:
    return json.loads((run_dir / "stages" / f"{name}.json").read_text())


def test_every_stage_passes_with_the_foreign_trainer(megatron_run: tuple[Path, str]) -> None:
    run_dir, out = megatron_run
    for name in ("baseline", "resume", "fault"):
        st = _stage(run_dir, name)
        assert st["verdict"] == "PASS", (name, st["summary"], st["checks"])
    assert _stage(run_dir, "nccl_profile")["verdict"] == "SKIP"  # CPU: gloo, no NCCL
    # the runner said what it added to the user's arguments, before anything ran
    assert "workload: --exit-signal-handler (added)" in out
    assert "workload: --log-interval 1 (added)" in out
    report = (run_dir / "infra_slo.md").read_text()
    assert "## Workload: megatron-lm" in report and "**0 malformed**" in report
    assert "/shared/fake_megatron/pretrain_gpt.py" in report


def test_resume_reads_megatrons_tracker_and_continues_the_loss(megatron_run: tuple[Path, str]) -> None:
    run_dir, _ = megatron_run
    m = _stage(run_dir, "resume")["metrics"]
    k = m["kill"]
    assert k["signal"] == "SIGKILL" and k["ranks_killed"] == k["world_size"] == 4
    assert k["latest_after_kill"] == k["ckpt_before_kill"] == m["ckpt_step"] == 4
    assert not k["complete_dirs_past_ckpt"]
    assert m["first_new_step"] == 5
    assert m["loss_rel_tol"] == 0.02 and m["loss_rel_diff"] <= 0.02
    ck = run_dir / "checkpoints" / "resume"
    assert (ck / LATEST_FILE).read_text().strip() == "16"
    it4 = ck / "iter_0000004"
    # Megatron-LM's torch_dist layout, written by the foreign script, nothing of the project's trainer
    assert (it4 / "metadata.json").is_file() and (it4 / ".metadata").is_file()
    assert sorted(p.name for p in it4.glob("*.distcp")) == [f"__{r}_0.distcp" for r in range(4)]
    assert not list(ck.rglob(COMPLETE_MARKER))


def test_steps_come_from_megatrons_last_rank_and_no_line_is_lost(megatron_run: tuple[Path, str]) -> None:
    run_dir, _ = megatron_run
    records = load_run(run_dir)
    steps = of_event(records, EVENT_STEP)
    assert steps and {r.rank for r in steps} == {3}  # print_rank_last: world size 4
    parses = of_event(records, EVENT_LOG_PARSE)
    assert parses and sum(int(r.get("malformed") or 0) for r in parses) == 0
    assert all(int(r.get("lines") or 0) > 0 for r in parses)
    base = _stage(run_dir, "baseline")["metrics"]
    assert base["steps"] == 16 and base["loss_last"] < base["loss_first"]
    assert base["tokens_per_s"] > 0 and base["checkpoints"] == 4
    logs = "\n".join(p.read_text(errors="replace") for p in run_dir.rglob("*.log"))
    assert "iteration        5/      16 | consumed samples:" in logs
    assert "successfully saved checkpoint from iteration       4 to" in logs


def test_fault_cases_recover_the_foreign_trainer(megatron_run: tuple[Path, str]) -> None:
    run_dir, _ = megatron_run
    m = _stage(run_dir, "fault")["metrics"]
    for case in ("floor", "trainer_kill", "torchrun_restart_ref", "node_loss"):
        assert m[case]["leftover_processes"] == 0, case
        # the floor's job is cancelled once a step past 4 is seen; the kills resume from the last save
        # before them (4, or 8 when a loaded machine delivered the kill late)
        want = 4 if case == "floor" else m[case]["ckpt_before_kill"]
        assert m[case]["resumed_from_step"] == want >= 4, case
    assert m["trainer_kill"]["first_new_step"] == m["trainer_kill"]["resumed_from_step"] + 1
    assert m["trainer_kill"]["loss_max_rel_diff"] <= m["trainer_kill"]["loss_rel_tol"] == 0.02
    assert len(m["node_loss"]["nodes_after"]) == 2
