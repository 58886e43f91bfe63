"""Ten faults of mixed kinds in one run on the local launcher with the lcm agent:
two "nodes" of one rank each (EP=2 MoE over gloo) and a spare label.

- rank: the trainer of one node SIGKILLed; the agents restart the ranks in place (same job);
- node: a node's agent and ranks SIGKILLed; the survivor gives up after hb_timeout_s (NODE_LOST) and
  the job is relaunched on the remaining node plus the spare (what a Slurm requeue does);
- partition: a node's agent and ranks frozen (SIGSTOP: no heartbeat, no answer, like a node cut off),
  detected by the survivor's heartbeat, then killed (its own deadman would end it once it is back) and
  the job relaunched.

The run finishes, its final loss equals the uninterrupted run's bitwise, and every recovery is recorded
with its downtime (fault -> first new step). Part of the whole matrix only (`full`): about 4 minutes.
"""

from __future__ import annotations

import random
import signal
import sys
import time
from pathlib import Path

import pytest
from faultmatrix import Matrix, Row

from lcm_runner import telemetry
from lcm_runner.config import from_dict
from lcm_runner.launch import procs
from lcm_runner.launch.base import Job, JobState
from lcm_runner.launch.torchrun import LocalLauncher
from lcm_runner.stages.common import Progress, StageContext

pytestmark = [pytest.mark.slow, pytest.mark.full]

ITERS = 70
CFG = {
    "name": "mixed",
    "launcher": "torchrun",
    "agent": "lcm",
    "nodes": 2,
    "procs_per_node": 1,
    "train_iters": ITERS,
    "save_interval": 2,
    "keep_last": 2,
    "max_restarts": 12,
    "rdzv_join_timeout_s": 30,
    "hb_timeout_s": 3.0,
    "master_port": 29750,
    "model": {
        "num_layers": 1,
        "hidden_size": 32,
        "num_attention_heads": 2,
        "ffn_hidden_size": 64,
        "seq_length": 32,
        "micro_batch_size": 2,
        "global_batch_size": 4,
        "ep": 2,
        "num_experts": 2,
        "moe_router_topk": 2,
    },
}
KINDS = ["rank", "node", "partition", "rank", "partition", "node", "rank", "node", "partition", "rank"]


def _ctx(run_dir: Path) -> StageContext:
    (run_dir / "telemetry").mkdir(parents=True)
    return StageContext(
        from_dict(CFG),
        run_dir,
        LocalLauncher(spare_nodes=1),
        Progress(sys.stdout),
        agent="lcm",
        step_sleep_ms=60,
    )


def _steps(run_dir: Path, since: float = 0.0) -> list[telemetry.Record]:
    return [r for r in telemetry.steps(telemetry.load_run(run_dir), rank=0) if r.ts > since]


def _wait_step(run_dir: Path, since: float, n: int, timeout: float = 240) -> telemetry.Record:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = _steps(run_dir, since)
        if len(st) >= n:
            return st[n - 1]
        time.sleep(0.05)
    raise AssertionError(f"no {n} steps after {since:.1f} within {timeout:.0f}s")


def _final_loss(run_dir: Path) -> str:
    st = [r for r in _steps(run_dir) if r.step == ITERS]
    assert st, "the run did not reach its last step"
    return str(st[-1].get("loss_hex"))


def test_ten_mixed_faults_in_one_run_finish_bitwise(
    tmp_path: Path, matrix: Matrix, request: pytest.FixtureRequest
) -> None:
    ref_ctx = _ctx(tmp_path / "ref")
    ref = ref_ctx.launcher.submit(ref_ctx.spec("ref", "ref"))
    try:
        assert ref_ctx.launcher.wait(ref, 600).state == JobState.COMPLETED
    finally:
        ref_ctx.launcher.close()
    want = _final_loss(ref_ctx.run_dir)

    ctx = _ctx(tmp_path / "run")
    launcher = ctx.launcher
    rng = random.Random(7)
    job: Job = launcher.submit(ctx.spec("run", "run"))
    log: list[dict] = []
    try:
        since = 0.0
        for i, kind in enumerate(KINDS):
            _wait_step(ctx.run_dir, since, rng.randint(3, 5))  # a few healthy steps (a checkpoint) first
            victim = job.nodes[rng.randrange(len(job.nodes))]
            if kind == "rank":
                ts = launcher.kill_trainer(job, victim)
            elif kind == "node":
                ts = launcher.kill_node(job, victim)
                job = launcher.relaunch(job, exclude=[victim])
            else:
                frozen = procs.scan(job.tag, victim)
                ts = time.time()
                procs.kill(frozen, signal.SIGSTOP)
                deadline = time.monotonic() + CFG["hb_timeout_s"] * 4 + 10
                while time.monotonic() < deadline:  # the survivor gives up on the frozen node
                    codes = launcher.status(job).exit_codes
                    if any(n != victim for n in codes):
                        break
                    time.sleep(0.05)
                detected = time.time() - ts
                gave_up = {n: c for n, c in launcher.status(job).exit_codes.items() if n != victim}
                assert set(gave_up.values()) == {76}, f"fault {i}: survivor exits {gave_up} (want NODE_LOST)"
                launcher.kill_node(job, victim)
                job = launcher.relaunch(job, exclude=[victim])
            first = _wait_step(ctx.run_dir, ts, 1)
            recs = telemetry.load_run(ctx.run_dir)
            ckpt = max(r.step for r in recs if r.event == "ckpt_end" and r.rank == 0 and r.ts < ts)
            assert first.step == ckpt + 1, f"fault {i} ({kind}): resumed at {first.step}, checkpoint {ckpt}"
            entry = {"i": i, "kind": kind, "node": victim, "step": first.step, "downtime_s": first.ts - ts}
            if kind == "partition":
                entry["detected_s"] = detected
            log.append(entry)
            print(f"fault {i}: {kind} of {victim}: first new step {first.step} after {first.ts - ts:.2f}s")
            since = first.ts
        deadline = time.monotonic() + 600
        while not launcher.status(job).state.finished and time.monotonic() < deadline:
            time.sleep(0.5)
        assert launcher.status(job).state == JobState.COMPLETED, launcher.status(job)
    finally:
        launcher.close()
    assert _final_loss(ctx.run_dir) == want, "the final loss differs from the uninterrupted run"
    resumes = [r for r in telemetry.load_run(ctx.run_dir) if r.event == "resume" and r.rank == 0]
    assert len(resumes) >= len(KINDS)
    by_kind = {k: [e["downtime_s"] for e in log if e["kind"] == k] for k in ("rank", "node", "partition")}
    parts = "; ".join(f"{k} x{len(v)}: {min(v):.1f}-{max(v):.1f} s" for k, v in by_kind.items())
    matrix.record(
        Row(
            fault="ten mixed faults in one run (rank, node, partition)",
            injected="local launcher, lcm agent: " + ", ".join(e["kind"] for e in log),
            detected_s=max(e.get("detected_s", 0.0) for e in log),
            recovered=True,
            downtime_s=sum(e["downtime_s"] for e in log) / len(log),
            steps_lost=0,
            good_ckpts_lost=0,
            notes=f"mean downtime; {parts}; final loss bitwise equal to the uninterrupted run",
        ),
        request,
    )
