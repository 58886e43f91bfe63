"""Multi-process CPU runs of the trainer (2 ranks, EP=2 MoE over gloo, tiny model).

One uninterrupted reference run, then: a SIGKILLed rank restarted by torchrun resumes from the last
checkpoint and continues bitwise-identically; a crash injected during a save leaves the previous
checkpoint as `latest` and resumable; SIGUSR1 -> checkpoint -> ExitCode.REQUEUE; keep-last-N; no
orphaned helper processes.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from trainruns import (
    ITERS,
    MODEL,
    REPO,
    TIMEOUT_S,
    Run,
    _env,
    _leftovers,
    _wait_for_no_leftovers,
    run_direct,
    run_one,
    run_torchrun,
)

from lcm_runner.ckpt.catalog import newest_known_good
from lcm_runner.contracts import LATEST_FILE, ExitCode, iter_dir_name
from lcm_runner.telemetry import load_run, of_event, steps
from lcm_runner.train.checkpoint import complete_steps, read_latest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """Uninterrupted, with async saves at 3 and 6 (interval) and 8 (end); keeps the last 2."""
    run = run_direct(
        tmp_path_factory.mktemp("ref"),
        ["--train-iters", str(ITERS), "--save-interval", "3", "--keep-last", "2", "--async-save",
         "--ckpt-good-after-steps", "2"],
    )  # fmt: skip
    assert run.codes == [0, 0], run.log
    return run


def test_reference_trains_saves_and_keeps_last_n(reference: Run) -> None:
    losses = [float.fromhex(h) for _, h in sorted(reference.losses().items())]
    assert len(losses) == ITERS
    assert losses[-1] < losses[0] - 0.05, f"loss did not fall: {losses}"
    assert read_latest(reference.ckpt) == ITERS
    # keep-last 2, and always the newest known-good: 3 (its completion + 2 healthy steps) or 6 (when its
    # asynchronous completion came early enough for steps 7 and 8 to count)
    good = newest_known_good(reference.ckpt)
    assert good in (3, 6)
    assert complete_steps(reference.ckpt) == sorted({6, 8, good})
    assert (reference.ckpt / iter_dir_name(3)).exists() == (good == 3)
    recs = reference.records()
    for rank in (0, 1):
        s = steps(recs, rank=rank)
        assert [r.step for r in s] == list(range(1, ITERS + 1))
        assert all(
            r.get("step_time_s") > 0 and r.get("tokens_per_s") > 0 and "comm_time_s" in r.data for r in s
        )
        ends = of_event(recs, "ckpt_end", rank=rank)
        assert [r.step for r in ends] == [3, 6, 8]
        assert all(r.get("bytes") > 0 and r.get("total_s") >= r.get("blocking_s") > 0 for r in ends)
        assert all(r.get("asynchronous") for r in ends)
    start = of_event(recs, "start", rank=0)[0]
    assert (start.get("world_size"), start.get("ep"), start.get("dp"), start.get("resumed_from")) == (
        2,
        2,
        2,
        None,
    )
    assert [r.get("code") for r in of_event(recs, "exit")] == [0, 0]
    assert _wait_for_no_leftovers(reference.tag) == []


def test_sigkill_restart_resumes_bitwise(reference: Run, tmp_path: Path) -> None:
    """torchrun restarts both ranks after rank 1 is SIGKILLed at step 5; they resume from step 3."""
    run = run_torchrun(
        tmp_path,
        [
            "--train-iters",
            str(ITERS),
            "--save-interval",
            "3",
            "--fault-kill-at-step",
            "5",
            "--fault-kill-rank",
            "1",
        ],
        max_restarts=1,
    )
    assert run.codes == [0], run.log
    recs = run.records()
    resumes = of_event(recs, "resume")
    assert sorted((r.rank, r.attempt, r.step) for r in resumes) == [(0, 1, 3), (1, 1, 3)]
    after = run.losses(attempt=1)
    assert sorted(after) == list(range(4, ITERS + 1))
    ref = reference.losses()
    assert after == {s: ref[s] for s in after}, "resumed losses differ from the uninterrupted run"
    assert run.losses(attempt=0) == {s: ref[s] for s in range(1, 5)}
    assert read_latest(run.ckpt) == ITERS
    # the killed rank's checkpoint Manager and resource_tracker must not outlive it
    assert _wait_for_no_leftovers(run.tag) == []


# A rank killed during a save (its shards written, the save never completed): tests/faults/test_ckpt_faults.py
# test_rank_killed_mid_save_leaves_latest_and_the_partial_is_removed (CI's fault subset).


def test_sigusr1_checkpoints_and_exits_requeue(tmp_path: Path) -> None:
    def signal_after_step_2(procs: list[subprocess.Popen], run_dir: Path) -> None:
        tel = run_dir / "telemetry" / "rank1.jsonl"
        deadline = time.time() + TIMEOUT_S
        while time.time() < deadline:
            if (
                tel.exists()
                and '"event":"step","rank":1' in tel.read_text()
                and '"step":2,' in tel.read_text()
            ):
                break
            time.sleep(0.1)
        procs[1].send_signal(signal.SIGUSR1)  # one rank only: all ranks must stop at the same step

    run = run_direct(
        tmp_path, ["--train-iters", "200", "--fault-sleep-ms", "200"], on_start=signal_after_step_2
    )
    assert run.codes == [ExitCode.REQUEUE, ExitCode.REQUEUE], run.log
    recs = run.records()
    last = [max(r.step for r in steps(recs, rank=k)) for k in (0, 1)]
    assert last[0] == last[1] < 200
    assert read_latest(run.ckpt) == last[0]
    assert [r.get("name") for r in of_event(recs, "signal")] == ["SIGUSR1"]
    assert [r.get("code") for r in of_event(recs, "exit")] == [int(ExitCode.REQUEUE)] * 2
    assert _wait_for_no_leftovers(run.tag) == []


def test_tensor_parallel_with_sequence_parallel_matches_one_process(tmp_path: Path) -> None:
    """TP=2 (MoE forces sequence parallelism, TorchLayerNorm) trains like one process: the first step's
    loss bitwise, the later ones within 1e-5 relative. TP splits the row-parallel matmuls' sums into
    per-rank partial sums and an all-reduce, so bitwise equality after an update holds only where the
    CPU's GEMM kernel blocks K the same way (it did on an AVX-512 machine, not on an AVX2 EPYC)."""
    argv = [*MODEL, "--train-iters", "3", "--expert-model-parallel-size", "1"]
    tp2 = run_direct(
        tmp_path / "tp2",
        ["--train-iters", "3", "--expert-model-parallel-size", "1", "--tensor-model-parallel-size", "2"],
    )
    assert tp2.codes == [0, 0], tp2.log
    one = tmp_path / "one"
    code, out = run_one(one, [*argv, "--telemetry-dir", str(one / "telemetry")], _env(uuid.uuid4().hex))
    assert code == 0, out[-4000:]
    single = {r.step: r.get("loss_hex") for r in steps(load_run(one), rank=0)}
    got = tp2.losses()
    assert sorted(got) == sorted(single) == [1, 2, 3]
    assert got[1] == single[1], (got, single)  # forward only: the same reductions
    for step in (2, 3):
        want = float.fromhex(single[step])
        assert math.isclose(float.fromhex(got[step]), want, rel_tol=1e-5), (step, got, single)
    assert of_event(tp2.records(), "start", rank=0)[0].get("tp") == 2


def test_checkpoint_layout_is_megatron_lm(reference: Run) -> None:
    latest = (reference.ckpt / LATEST_FILE).read_text().strip()
    d = reference.ckpt / iter_dir_name(int(latest))
    assert (d / "metadata.json").is_file() and (d / ".metadata").is_file()
    assert sorted(p.name for p in d.glob("__*_*.distcp"))[:1], "no shard files"
    assert {p.name.split("_")[2] for p in d.glob("__*_*.distcp")} == {"0", "1"}  # one shard set per rank
    assert not list(reference.ckpt.glob(".*.tmp"))


HELPERS_SCRIPT = """
import multiprocessing as mp, os, time
from multiprocessing import resource_tracker
from lcm_runner.train import cpu_compat, procutil
cpu_compat.stub_triton_kernels()  # as the trainer does on a CPU build, before megatron is imported
procutil.install_checkpoint_results_queue()  # what the trainer's CheckpointManager does
writer = mp.get_context("fork").Process(target=time.sleep, args=(120,))  # as an async save's writer
writer.start()
print(procutil._manager._process.pid, resource_tracker._resource_tracker._pid, writer.pid, flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_checkpoint_helpers_survive_preemption_signals_and_die_with_the_trainer() -> None:
    """The trainer's helpers (checkpoint Manager, resource_tracker, a forked writer): SIGUSR1/SIGTERM to
    every process, as Slurm's --signal does, leaves the Manager and tracker running; a SIGKILL of the
    trainer (run as a plain process, as under stock torchrun) leaves none of them behind."""
    tag = uuid.uuid4().hex
    p = subprocess.Popen(
        [sys.executable, "-c", HELPERS_SCRIPT], cwd=REPO, env=_env(tag), stdout=subprocess.PIPE, text=True
    )
    try:
        assert p.stdout is not None
        manager, tracker, writer = (int(x) for x in p.stdout.readline().split())
        for pid in (manager, tracker):
            os.kill(pid, signal.SIGUSR1)
            os.kill(pid, signal.SIGTERM)
        time.sleep(1.0)
        assert _alive(manager), "the checkpoint Manager died on SIGUSR1/SIGTERM"
        assert _alive(tracker), "the resource_tracker died on SIGUSR1/SIGTERM"
        assert _alive(writer) and p.poll() is None
        p.kill()
        p.wait(timeout=10)
        assert _wait_for_no_leftovers(tag) == []
    finally:
        if p.poll() is None:
            p.kill()
        for pid in _leftovers(tag):
            os.kill(int(pid.split(":")[0]), signal.SIGKILL)


def test_sigkill_under_stock_torchrun_right_after_an_async_save_leaves_no_helper(tmp_path: Path) -> None:
    """Rank 1 SIGKILLed at step 3, right after the asynchronous save of step 2 was handed to its forked
    writer; no restart: torchrun stops rank 0. Nothing of the run (Managers, resource_trackers,
    writers) may outlive it."""
    run = run_torchrun(
        tmp_path,
        ["--train-iters", str(ITERS), "--save-interval", "2", "--async-save",
         "--fault-kill-at-step", "3", "--fault-kill-rank", "1"],
        max_restarts=0,
    )  # fmt: skip
    assert run.codes != [0], run.log
    assert "fault injection: SIGKILL at step 3" in (tmp_path / "torchrun.log").read_text(errors="replace")
    begun = [(r.rank, r.step) for r in of_event(run.records(), "ckpt_begin")]
    assert (1, 2) in begun, run.log  # the killed rank had started a save
    assert _wait_for_no_leftovers(run.tag) == []


def test_hold_at_step_pauses_every_rank_past_the_collective_timeout(reference: Run, tmp_path: Path) -> None:
    """`--fault-hold-at-step 4 --fault-hold-file F`: both ranks finish step 3, wait while F exists (here
    longer than the 6 s collective timeout: no collective is pending while held), go on once F is
    removed, and train bitwise like the uninterrupted run."""
    hold = tmp_path / "hold"
    hold.write_text("")
    seen: dict[str, object] = {}

    def release_after_a_while(procs: list[subprocess.Popen], run_dir: Path) -> None:
        tel = [run_dir / "telemetry" / f"rank{k}.jsonl" for k in (0, 1)]

        def last_step(k: int) -> int:
            if not tel[k].exists():
                return 0
            return max((r.step for r in steps(load_run(run_dir), rank=k)), default=0)

        deadline = time.time() + TIMEOUT_S
        while time.time() < deadline and not (last_step(0) >= 3 and last_step(1) >= 3):
            time.sleep(0.1)
        time.sleep(8.0)  # > --distributed-timeout-minutes 0.1 (6 s)
        seen["held_at"] = (last_step(0), last_step(1))
        seen["alive"] = [p.poll() is None for p in procs]
        hold.unlink()

    run = run_direct(
        tmp_path,
        ["--train-iters", str(ITERS), "--distributed-timeout-minutes", "0.1",
         "--fault-hold-at-step", "4", "--fault-hold-file", str(hold)],
        on_start=release_after_a_while,
    )  # fmt: skip
    assert run.codes == [0, 0], run.log
    assert seen == {"held_at": (3, 3), "alive": [True, True]}, seen
    assert "holding before step 4" in run.log and "hold released after" in run.log
    assert run.losses() == reference.losses()
