"""Checkpoint and numerical faults on real multi-process CPU runs (2 ranks, EP=2 MoE over gloo).

Each case injects a fault the trainer does not inject into itself (bytes flipped on disk, a shard
deleted, a filesystem that fills up) or a NaN through the trainer's own hook, recovers as an operator
would (resubmit, restart), and checks: `latest` only on a verified checkpoint, the newest known-good
checkpoint never lost, no step lost beyond the last good checkpoint, the loss continuing bitwise.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from faultmatrix import Matrix, Row
from trainruns import (
    MODEL,
    REPO,
    TIMEOUT_S,
    Run,
    _env,
    _free_port,
    _wait_for_no_leftovers,
    run_direct,
    start_rank,
)

from lcm_runner.ckpt import catalog, integrity
from lcm_runner.contracts import ExitCode, iter_dir_name
from lcm_runner.telemetry import load_run, of_event, steps

pytestmark = pytest.mark.slow

ITERS = 12
SAVE = ["--save-interval", "2", "--keep-last", "2", "--ckpt-good-after-steps", "2"]


def losses(run_dir: Path, attempt: int | None = None, job_since: float = 0.0) -> dict[int, str]:
    return {
        r.step: r.get("loss_hex")
        for r in steps(load_run(run_dir), rank=0)
        if (attempt is None or r.attempt == attempt) and r.ts >= job_since
    }


def flip(path: Path, n: int = 64) -> None:
    b = bytearray(path.read_bytes())
    off = len(b) // 2
    for i in range(n):
        b[off + i] ^= 0xFF
    path.write_bytes(bytes(b))


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """Uninterrupted: ITERS steps, saves every 2, keep-last 2."""
    run = run_direct(tmp_path_factory.mktemp("ref"), ["--train-iters", str(ITERS), *SAVE])
    assert run.codes == [0, 0], run.log
    return run


@pytest.fixture(scope="module")
def first_half(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The first 8 steps of the same run (checkpoints 6 and 8 left, 6 known-good)."""
    run = run_direct(tmp_path_factory.mktemp("half"), ["--train-iters", "8", *SAVE])
    assert run.codes == [0, 0], run.log
    assert catalog.complete_steps(run.ckpt) == [6, 8] and catalog.newest_known_good(run.ckpt) == 6
    return run


def copy_run(src: Run, dst: Path) -> Path:
    shutil.copytree(src.ckpt, dst / "ckpt")
    return dst


def resume(run_dir: Path, extra: list[str] | None = None, attempt: int = 0) -> Run:
    env = {"TORCHELASTIC_RESTART_COUNT": str(attempt)} if attempt else None
    return run_direct(run_dir, ["--train-iters", str(ITERS), *SAVE, *(extra or [])], env_extra=env)


# ---------------------------------------------------------------------------------------- integrity


def test_corrupt_shard_of_latest_falls_back_and_keeps_the_good_one(
    reference: Run, first_half: Run, tmp_path: Path, matrix: Matrix, request: pytest.FixtureRequest
) -> None:
    """The issue's case: 64 bytes flipped in one __1_0.distcp of the latest checkpoint, keep-last 2."""
    d = copy_run(first_half, tmp_path)
    flip(d / "ckpt" / iter_dir_name(8) / "__1_0.distcp")
    run = resume(d)
    assert run.codes == [0, 0], run.log
    out = (d / "rank0.log").read_text()
    assert "checkpoint" in out and "iter_0000008 rejected: __1_0.distcp" in out and "mismatch" in out
    assert "falling back to iter_0000006 (verified)" in out
    recs = load_run(d)
    rej = of_event(recs, "ckpt_rejected", rank=0)
    assert [(r.step, r.get("file")) for r in rej] == [(8, "__1_0.distcp")]
    assert [r.step for r in of_event(recs, "resume", rank=0)] == [6]
    ref = reference.losses()
    after = losses(d)
    assert after == {s: ref[s] for s in range(7, ITERS + 1)}, "the continuation differs from uninterrupted"
    # nothing lost: latest verified, a known-good checkpoint left, everything left verifies
    assert catalog.read_latest(d / "ckpt") == ITERS
    good = catalog.newest_known_good(d / "ckpt")
    assert good is not None and good >= 6
    assert all(e.state == "verified" for e in catalog.scan(d / "ckpt"))
    matrix.record(
        Row(
            fault="damaged shard in the latest checkpoint",
            injected="64 bytes flipped in iter_0000008/__1_0.distcp, then a normal resubmission",
            detected_s=rej[0].ts - of_event(recs, "start", rank=0)[0].ts,
            recovered=True,
            downtime_s=steps(recs, rank=0)[0].ts - of_event(recs, "start", rank=0)[0].ts,
            steps_lost=min(after) - 7,
            good_ckpts_lost=0 if good >= 6 else 1,
            notes="fell back to iter_0000006 (verified, known-good); continuation bitwise equal",
        ),
        request,
    )


DAMAGE = {
    "missing shard": lambda d: (d / "__0_0.distcp").unlink(),
    "truncated shard": lambda d: (d / "__1_0.distcp").write_bytes((d / "__1_0.distcp").read_bytes()[:64]),
    "unreadable metadata": lambda d: (d / "metadata.json").write_text("{garbage"),
    "flipped torch metadata": lambda d: flip(d / ".metadata", 16),
}


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_other_damage_of_latest_is_caught_before_a_tensor_is_used(
    first_half: Run, tmp_path: Path, kind: str, matrix: Matrix, request: pytest.FixtureRequest
) -> None:
    d = copy_run(first_half, tmp_path)
    DAMAGE[kind](d / "ckpt" / iter_dir_name(8))
    run = run_direct(d, ["--train-iters", "7", *SAVE])  # resume from 6, one step, no new save
    assert run.codes == [0, 0], run.log
    recs = load_run(d)
    rej = of_event(recs, "ckpt_rejected", rank=0)
    assert [r.step for r in rej] == [8] and [r.step for r in of_event(recs, "resume", rank=0)] == [6]
    assert "falling back to iter_0000006 (verified); latest now names it" in (d / "rank0.log").read_text()
    assert catalog.read_latest(d / "ckpt") == 7  # the end-of-run save, after 6
    assert catalog.is_rejected(d / "ckpt" / iter_dir_name(8))
    assert integrity.verify_checkpoint(d / "ckpt" / iter_dir_name(7)).ok
    matrix.record(
        Row(
            fault=f"damaged latest checkpoint: {kind}",
            injected=f"{kind} in iter_0000008, then a resubmission",
            detected_s=rej[0].ts - of_event(recs, "start", rank=0)[0].ts,
            recovered=True,
            downtime_s=steps(recs, rank=0)[0].ts - of_event(recs, "start", rank=0)[0].ts,
            steps_lost=0,
            good_ckpts_lost=0,
            notes=f"rejected: {rej[0].get('file')}: {rej[0].get('reason')}"[:200],
        ),
        request,
    )


@pytest.mark.parametrize(
    "content",
    [  # CI runs one (`-m "not full"`); scripts/faults all three
        "8\x00\x00garbage",
        pytest.param("", marks=pytest.mark.full),
        pytest.param("iter_0000008", marks=pytest.mark.full),
    ],
)
def test_damaged_latest_tracker_resumes_from_the_newest_that_verifies(
    reference: Run,
    first_half: Run,
    tmp_path: Path,
    content: str,
    matrix: Matrix,
    request: pytest.FixtureRequest,
) -> None:
    """latest_checkpointed_iteration.txt itself damaged (empty, binary junk, a directory name): no
    traceback, no fresh start: the newest complete checkpoint that verifies, and the tracker rewritten."""
    d = copy_run(first_half, tmp_path)
    (d / "ckpt" / "latest_checkpointed_iteration.txt").write_text(content)
    run = resume(d)
    assert run.codes == [0, 0], run.log
    out = (d / "rank0.log").read_text()
    assert "expected a step number" in out and "choosing the newest checkpoint that verifies" in out
    recs = load_run(d)
    assert [r.step for r in of_event(recs, "resume", rank=0)] == [8]
    ref = reference.losses()
    assert losses(d) == {s: ref[s] for s in range(9, ITERS + 1)}, "the continuation differs"
    assert catalog.read_latest(d / "ckpt") == ITERS
    start = of_event(recs, "start", rank=0)[0].ts
    matrix.record(
        Row(
            fault="damaged latest-checkpoint tracker file",
            injected=f"latest_checkpointed_iteration.txt overwritten with {content!r}, then a resubmission",
            detected_s=0.0,
            recovered=True,
            downtime_s=steps(recs, rank=0)[0].ts - start,
            steps_lost=0,
            good_ckpts_lost=0,
            notes="resumed from iter_0000008 (the newest that verifies), tracker rewritten, bitwise",
        ),
        request,
    )


def test_no_checkpoint_verifies_stops_with_its_own_code(
    first_half: Run, tmp_path: Path, matrix: Matrix, request: pytest.FixtureRequest
) -> None:
    d = copy_run(first_half, tmp_path)
    for s in (6, 8):
        flip(d / "ckpt" / iter_dir_name(s) / "__0_0.distcp")
    run = resume(d)
    assert run.codes == [ExitCode.NO_GOOD_CHECKPOINT] * 2, run.log
    out = (d / "rank0.log").read_text()
    assert "no checkpoint in" in out and "iter_0000008: __0_0.distcp" in out and "iter_0000006" in out
    recs = load_run(d)
    assert not steps(recs), "it must not start from scratch"
    assert catalog.read_latest(d / "ckpt") == 8  # untouched: an operator decides
    matrix.record(
        Row(
            fault="every checkpoint damaged",
            injected="bytes flipped in iter 6 and iter 8, then a resubmission",
            detected_s=None,
            recovered=False,
            downtime_s=None,
            steps_lost=0,
            good_ckpts_lost=0,
            notes="exit 78 (NO_GOOD_CHECKPOINT) naming both files; never started from scratch",
        ),
        request,
    )


# ---------------------------------------------------------------------------------- numerical guard


def test_transient_nan_is_skipped_and_never_saved(tmp_path: Path) -> None:
    run = run_direct(
        tmp_path, ["--train-iters", "8", *SAVE, "--fault-nan-steps", "4", "--fault-nan-rank", "1"]
    )
    assert run.codes == [0, 0], run.log
    recs = load_run(tmp_path)
    assert [(r.step, r.get("what")) for r in of_event(recs, "nonfinite", rank=0)] == [(4, "loss+grad")]
    assert 4 not in {r.step for r in steps(recs)}  # no step record, no update
    assert 4 not in catalog.iter_steps(run.ckpt) and not (run.ckpt / iter_dir_name(4)).exists()
    assert all(r.get("loss") == r.get("loss") for r in steps(recs))  # every recorded loss finite
    assert catalog.complete_steps(run.ckpt)[-1] == 8


def test_nan_burst_rewinds_to_known_good_and_the_restart_is_bitwise(
    reference: Run, tmp_path: Path, matrix: Matrix, request: pytest.FixtureRequest
) -> None:
    nan = ["--fault-nan-steps", "9,10,11,12", "--fault-nan-rank", "1", "--fault-nan-attempts", "1"]
    first = resume(tmp_path, nan)
    assert first.codes == [ExitCode.NONFINITE] * 2, first.log
    assert catalog.read_latest(first.ckpt) == 6  # 8 never saw healthy steps after it: not known-good
    assert "latest rewound from 8 to known-good 6" in (tmp_path / "rank0.log").read_text()
    exit_ts = max(r.ts for r in of_event(load_run(tmp_path), "exit"))
    second = resume(tmp_path, nan, attempt=1)  # what the agent / the sbatch requeue does
    assert second.codes == [0, 0], second.log
    recs = load_run(tmp_path)
    assert [r.step for r in of_event(recs, "resume", rank=0)] == [6]
    ref = reference.losses()
    after = losses(tmp_path, attempt=1)
    assert after == {s: ref[s] for s in range(7, ITERS + 1)}
    first_new = min(r.ts for r in steps(recs, rank=0) if r.attempt == 1)
    nonf = of_event(recs, "nonfinite", rank=0)
    matrix.record(
        Row(
            fault="NaN loss/grad burst (4 steps > budget 3)",
            injected="--fault-nan-steps 9,10,11,12 on rank 1, first attempt",
            detected_s=0.0,
            recovered=True,
            downtime_s=first_new - exit_ts,
            steps_lost=0,
            good_ckpts_lost=0,
            notes=f"{len(nonf)} steps skipped, exit 77, latest 8 -> known-good 6, restart bitwise equal",
        ),
        request,
    )


def test_deterministic_nan_stops_after_the_allowed_rewinds(tmp_path: Path) -> None:
    nan = ["--fault-nan-steps", "9,10,11,12", "--fault-nan-rank", "0", "--max-nonfinite-rewinds", "2"]
    codes = [resume(tmp_path, nan, attempt=a).codes for a in range(3)]
    assert codes == [[ExitCode.NONFINITE] * 2, [ExitCode.NONFINITE] * 2, [ExitCode.NONFINITE_REPEATED] * 2]
    assert "again after 2 rewind(s) to iter 6" in (tmp_path / "rank0.log").read_text()
    assert catalog.read_latest(tmp_path / "ckpt") == 6 and catalog.newest_known_good(tmp_path / "ckpt") == 6


def test_nan_from_the_first_step_has_nothing_to_rewind_to(tmp_path: Path) -> None:
    run = run_direct(
        tmp_path, ["--train-iters", "6", *SAVE, "--fault-nan-steps", "1,2", "--max-nonfinite-skips", "1"]
    )
    assert run.codes == [ExitCode.NONFINITE_REPEATED] * 2, run.log
    assert "no known-good checkpoint" in (tmp_path / "rank0.log").read_text()


# ------------------------------------------------------------------------------------- full disk


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 1.2 MB tmpfs (never the host's disk): room for one checkpoint of the tiny model, not two."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root")
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1200k", "tmpfs", str(mnt)], check=False)
    if p.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_full_disk_during_a_save_keeps_latest_and_removes_the_partial(
    tmp_path: Path, small_fs: Path, mode: str, matrix: Matrix, request: pytest.FixtureRequest
) -> None:
    extra = ["--save-interval", "2", "--keep-last", "2", "--train-iters", "8"]
    if mode == "async":
        extra.append("--async-save")
    env = _env("fulldisk")
    env.update(WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    ckpt = small_fs / "ckpt"
    procs = []
    for rank in range(2):
        args = [*MODEL, "--save", str(ckpt), "--telemetry-dir", str(tmp_path / "telemetry"), *extra]
        e = dict(env, RANK=str(rank), LOCAL_RANK=str(rank))
        procs.append(start_rank(args, e, tmp_path / f"rank{rank}.log", "fulldisk"))
    codes = [p.wait(timeout=TIMEOUT_S) for p in procs]
    out = (tmp_path / "rank0.log").read_text(errors="replace")
    assert codes == [ExitCode.CKPT_SAVE_FAILED] * 2, out[-3000:]
    line = next(ln for ln in out.splitlines() if "failed:" in ln and "lcm-train" in ln)
    assert "No space left on device" in line and "ENOSPC" in line and "latest stays at step 2" in line
    assert catalog.read_latest(ckpt) == 2
    assert catalog.iter_steps(ckpt) == [2], "the partial checkpoint must be removed"
    assert integrity.verify_checkpoint(ckpt / iter_dir_name(2)).ok
    recs = load_run(tmp_path)
    failed = of_event(recs, "ckpt_failed", rank=0)
    assert [r.step for r in failed] == [4]
    begin = next(r for r in of_event(recs, "ckpt_begin", rank=0) if r.step == 4)
    # room again (an operator freed space): the run resumes from 2 with nothing else lost
    subprocess.run(["mount", "-o", "remount,size=8m", str(small_fs)], check=True)
    resumed = run_direct(tmp_path / "again", ["--train-iters", "8", "--load", str(ckpt)], model=None)
    assert resumed.codes == [0, 0], resumed.log
    assert [r.step for r in of_event(load_run(tmp_path / "again"), "resume", rank=0)] == [2]
    matrix.record(
        Row(
            fault=f"checkpoint filesystem full during a save ({mode})",
            injected="1.2 MB tmpfs as --save: room for one checkpoint, the second fails",
            detected_s=failed[0].ts - begin.ts,
            recovered=True,
            downtime_s=None,
            steps_lost=0,
            good_ckpts_lost=0,
            notes=f"exit 80, '{line.split('lcm-train: ', 1)[1][:150]}'; resumed from 2 once space was freed",
        ),
        request,
    )
    assert _wait_for_no_leftovers("fulldisk") == []


# ------------------------------------------------------------------------------ many faults, one job


def test_ten_rank_kills_in_one_job_finish_bitwise(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, matrix: Matrix, request: pytest.FixtureRequest
) -> None:
    """Ten SIGKILLs of a rank at random steps in one job under the lcm agent (fork restarts); the final
    loss equals the uninterrupted run's bitwise and every recovery's downtime is in the agent's log."""
    iters, interval = 48, 2
    rng = random.Random(10)
    kills, s = [], 2
    for _ in range(10):
        s += rng.randint(2, 4)
        kills.append(s)
    assert kills[-1] < iters
    ref = run_direct(tmp_path_factory.mktemp("ref48"), ["--train-iters", str(iters), "--save-interval", "2"])
    assert ref.codes == [0, 0], ref.log
    port = _free_port()
    events = tmp_path / "agent.jsonl"
    cmd = [
        sys.executable, "-m", "lcm_runner.launch.agent", "--nnodes", "1", "--node-rank", "0",
        "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(port),
        "--max-restarts", "12", "--events", str(events), "--log-dir", str(tmp_path / "logs"), "--",
        *MODEL, "--train-iters", str(iters), "--save-interval", str(interval),
        "--save", str(tmp_path / "ckpt"),
        "--telemetry-dir", str(tmp_path / "telemetry"), "--fault-kill-schedule", ",".join(map(str, kills)),
    ]  # fmt: skip
    env = _env("tenkills")
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    recs = load_run(tmp_path)
    final = {r.step: r.get("loss_hex") for r in steps(recs, rank=0)}
    assert final[iters] == ref.losses()[iters], "final loss differs from the uninterrupted run"
    attempts = sorted({r.attempt for r in steps(recs, rank=0)})
    assert attempts == list(range(11)), attempts
    downs = []
    for a in range(10):
        last = max(r.ts for r in steps(recs, rank=0) if r.attempt == a)
        first = min(r.ts for r in steps(recs, rank=0) if r.attempt == a + 1)
        downs.append(first - last)
        resumed = [r.step for r in of_event(recs, "resume", rank=0) if r.attempt == a + 1]
        assert resumed and resumed[0] >= kills[a] - interval, (a, resumed, kills[a])
    matrix.record(
        Row(
            fault="ten rank kills in one job",
            injected=f"SIGKILL of rank (attempt mod 2) at steps {kills}",
            detected_s=None,
            recovered=True,
            downtime_s=sum(downs) / len(downs),
            steps_lost=0,
            good_ckpts_lost=0,
            notes=f"mean downtime; per kill: {', '.join(f'{d:.2f}' for d in downs)} s; final loss bitwise",
        ),
        request,
    )


# ----------------------------------------------------------------------- crash in a save, preemption


def test_rank_killed_mid_save_leaves_latest_and_the_partial_is_removed(
    reference: Run, tmp_path: Path, matrix: Matrix, request: pytest.FixtureRequest
) -> None:
    """Rank 1 dies hard once its shards of step 8 are written, before the save completes."""
    crashed = run_direct(tmp_path, ["--train-iters", str(ITERS), *SAVE, "--fault-crash-in-save", "8",
                                    "--fault-crash-rank", "1"])  # fmt: skip
    assert crashed.codes[1] == ExitCode.FAILURE and crashed.codes[0] != 0, crashed.log
    assert catalog.read_latest(crashed.ckpt) == 6
    assert not catalog.is_complete(crashed.ckpt / iter_dir_name(8))
    assert (crashed.ckpt / iter_dir_name(8)).is_dir()  # shards written, the save never completed
    assert _wait_for_no_leftovers(crashed.tag) == []  # the surviving rank and the writers are gone too
    died = max(r.ts for r in of_event(load_run(tmp_path), "ckpt_begin", rank=1) if r.step == 8)
    again = resume(tmp_path, attempt=1)
    assert again.codes == [0, 0], again.log
    out = (tmp_path / "rank0.log").read_text()
    line = next(ln for ln in out.splitlines() if "iter_0000008: an incomplete save" in ln)
    recs = load_run(tmp_path)
    assert [r.step for r in of_event(recs, "resume", rank=0)] == [6]
    ref = reference.losses()
    assert losses(tmp_path, attempt=1) == {s: ref[s] for s in range(7, ITERS + 1)}
    assert 8 in [r.step for r in of_event(recs, "ckpt_end", rank=0) if r.attempt == 1]  # saved again
    matrix.record(
        Row(
            fault="rank killed during a save",
            injected="--fault-crash-in-save 8: rank 1 exits hard after writing its shards of step 8",
            detected_s=None,
            recovered=True,
            downtime_s=min(r.ts for r in steps(recs, rank=0) if r.attempt == 1) - died,
            steps_lost=0,
            good_ckpts_lost=0,
            notes=f"latest stayed 6; on restart: '{line.split('lcm-train: ', 1)[-1]}'; continuation bitwise",
        ),
        request,
    )


def test_preemption_signal_checkpoints_and_the_requeue_resumes_from_it(
    reference: Run, tmp_path: Path, matrix: Matrix, request: pytest.FixtureRequest
) -> None:
    """SIGUSR1 (what Slurm's --signal / `scontrol requeue` deliver) to one rank mid-run."""
    import signal as sig
    import time

    def usr1_after_step_3(procs: list[subprocess.Popen], run_dir: Path) -> None:
        tel = run_dir / "telemetry" / "rank0.jsonl"
        deadline = time.time() + TIMEOUT_S
        while time.time() < deadline and not (tel.exists() and '"step":3,' in tel.read_text()):
            time.sleep(0.05)
        procs[1].send_signal(sig.SIGUSR1)

    first = run_direct(
        tmp_path, ["--train-iters", str(ITERS), *SAVE, "--fault-sleep-ms", "150"], on_start=usr1_after_step_3
    )
    assert first.codes == [ExitCode.REQUEUE] * 2, first.log
    recs = load_run(tmp_path)
    stopped = max(r.step for r in steps(recs, rank=0))
    assert catalog.read_latest(first.ckpt) == stopped
    signalled = of_event(recs, "signal", rank=1)[0].ts
    saved = next(r for r in of_event(recs, "ckpt_end", rank=0) if r.step == stopped).ts
    again = resume(tmp_path, attempt=1)
    assert again.codes == [0, 0], again.log
    recs = load_run(tmp_path)
    assert [r.step for r in of_event(recs, "resume", rank=0)] == [stopped]
    ref = reference.losses()
    assert losses(tmp_path, attempt=1) == {s: ref[s] for s in range(stopped + 1, ITERS + 1)}
    matrix.record(
        Row(
            fault="preemption (SIGUSR1 before the time limit / scontrol requeue)",
            injected="SIGUSR1 to rank 1 after step 3, then the requeue",
            detected_s=saved - signalled,
            recovered=True,
            downtime_s=None,
            steps_lost=0,
            good_ckpts_lost=0,
            notes=f"checkpoint at step {stopped} {saved - signalled:.2f} s after the signal, exit 75; "
            "the requeued run resumed from it, bitwise",
        ),
        request,
    )
