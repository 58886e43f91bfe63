"""Fast process restarts under the lcm agent (`--warm-ranks --host-copy`) on real 2-rank CPU runs.

A rank killed with SIGKILL loses its process and with it the in-process host copy of the checkpoint; with
`--host-copy` the copy lives in a shared-memory file of the agent's, so the restarted ranks restore from
it (resume source "shm") instead of verifying and reading the checkpoint files, and with `--warm-ranks`
the restarted ranks are spares forked and warmed before the fault (on a GPU: their CUDA context). What is
checked here, where the speed-up itself cannot be measured (no CUDA on CPU; benchmarks/restart_paths.sh
measures it on a GPU): every restart is served by the spares and the shared copy, the continuation is
bitwise that of an uninterrupted run, a dead spare or a missing copy falls back to the cold path, and
nothing is left behind (no process, no shared-memory directory).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from faultmatrix import Matrix, Row
from trainruns import MODEL, REPO, _env, _free_port, _wait_for_no_leftovers, run_direct

from lcm_runner.telemetry import load_run, of_event, steps

pytestmark = pytest.mark.slow

ITERS = 14
INTERVAL = 4


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory):
    run = run_direct(
        tmp_path_factory.mktemp("ref"), ["--train-iters", str(ITERS), "--save-interval", str(INTERVAL)]
    )
    assert run.codes == [0, 0], run.log
    return run


def _free_ports(n: int) -> int:
    """A port p with p .. p+n-1 free (the agent's store, then one rendezvous port per generation)."""
    for _ in range(50):
        p = _free_port()
        if p + n < 65536 and all(_bindable(p + i) for i in range(1, n)):
            return p
    raise AssertionError(f"no {n} free ports in a row")


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _agent(tmp_path: Path, tag: str, *extra: str, train: tuple[str, ...] = ()) -> subprocess.Popen:
    cmd = [
        sys.executable, "-m", "lcm_runner.launch.agent", "--nnodes", "1", "--node-rank", "0",
        "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(_free_ports(6)),
        "--max-restarts", "4", "--events", str(tmp_path / "agent.jsonl"), "--log-dir", str(tmp_path / "logs"),
        *extra, "--",
        *MODEL, "--train-iters", str(ITERS), "--save-interval", str(INTERVAL),
        "--save", str(tmp_path / "ckpt"), "--telemetry-dir", str(tmp_path / "telemetry"), *train,
    ]  # fmt: skip
    env = dict(_env(tag), LCM_RUN_TAG=tag)
    out = open(tmp_path / "agent.out", "wb")  # noqa: SIM115 - handed to the child
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)


def _events(tmp_path: Path) -> list[dict]:
    p = tmp_path / "agent.jsonl"
    return [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []


def _wait_event(tmp_path: Path, pred, what: str, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for e in _events(tmp_path):
            if pred(e):
                return e
        time.sleep(0.05)
    raise AssertionError(f"no {what} within {timeout}s: {(tmp_path / 'agent.out').read_text()[-3000:]}")


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def test_every_kill_is_served_by_warm_spares_and_the_shared_copy_bitwise(
    tmp_path: Path, reference, matrix: Matrix, request: pytest.FixtureRequest
) -> None:
    """Two SIGKILLs (rank 0 at step 6, rank 1 at step 11): both restarts take the spares (spawn warm
    [0, 1]) and restore from shared memory (steps 4 and 8), every step's loss equals the uninterrupted run."""
    p = _agent(tmp_path, "warm", "--warm-ranks", "--warm-delay", "0", "--host-copy",
               train=("--fault-kill-schedule", "6,11", "--fault-sleep-ms", "150"))  # fmt: skip
    try:
        code = p.wait(timeout=600)
    finally:
        if p.poll() is None:
            p.kill()
    out = (tmp_path / "agent.out").read_text()
    assert code == 0, out[-4000:]
    ev = _events(tmp_path)
    spawns = {e["gen"]: e for e in ev if e["event"] == "spawn"}
    assert sorted(spawns) == [0, 1, 2]
    assert spawns[0]["warm"] == [] and spawns[1]["warm"] == [0, 1] and spawns[2]["warm"] == [0, 1], spawns
    for gen in (1, 2):  # the ranks of a generation are the spares forked during the one before
        spared = [
            e for e in ev if e["event"] == "spares" and spawns[gen - 1]["ts"] <= e["ts"] < spawns[gen]["ts"]
        ]
        assert spared and set(spawns[gen]["pids"]) <= {pid for e in spared for pid in e["pids"]}, (
            gen,
            spared,
        )
    recs = load_run(tmp_path)
    resumed = {r.attempt: (r.step, r.get("source")) for r in of_event(recs, "resume", rank=0)}
    assert resumed == {1: (4, "shm"), 2: (8, "shm")}, resumed
    assert {r.attempt: r.get("source") for r in of_event(recs, "resume", rank=1)} == {1: "shm", 2: "shm"}
    ref = reference.losses()
    for attempt in (0, 1, 2):
        got = {r.step: r.get("loss_hex") for r in steps(recs, rank=0) if r.attempt == attempt}
        assert got and all(got[s] == ref[s] for s in got), attempt
    assert max(r.step for r in steps(recs, rank=0)) == ITERS
    made = [e["dir"] for e in ev if e["event"] == "host_copy"]
    assert len(made) == 1 and made[0].startswith("/dev/shm/") and not Path(made[0]).exists()
    assert all(not e["left"] for e in ev if e["event"] == "teardown")
    assert _wait_for_no_leftovers("warm") == []
    downs = []
    for a in (0, 1):
        last = max(r.ts for r in steps(recs, rank=0) if r.attempt == a)
        first = min(r.ts for r in steps(recs, rank=0) if r.attempt == a + 1)
        downs.append(first - last)
    matrix.record(
        Row(
            fault="rank killed, warm spares + shared host copy",
            injected="SIGKILL of rank 0 at step 6, of rank 1 at step 11 (agent --warm-ranks --host-copy)",
            detected_s=None,
            recovered=True,
            downtime_s=sum(downs) / len(downs),
            steps_lost=0,
            good_ckpts_lost=0,
            notes=f"per kill {', '.join(f'{d:.2f}' for d in downs)} s; restored from shared memory "
            "(steps 4, 8); bitwise",
        ),
        request,
    )


def test_a_dead_spare_is_replaced_by_a_cold_fork_and_a_missing_copy_by_the_disk(
    tmp_path: Path, reference
) -> None:
    """The spare of local rank 1 is killed and the shared copy removed before rank 0 is killed: the
    restart forks rank 1 cold, rank 0 still comes from its spare, and the load is from disk; bitwise."""
    p = _agent(tmp_path, "coldfall", "--warm-ranks", "--warm-delay", "0", "--host-copy",
               train=("--fault-sleep-ms", "250"))  # fmt: skip
    try:
        _wait_event(tmp_path, lambda e: e["event"] == "spares", "spares")
        recs_dir = tmp_path

        def stepped(n: int) -> bool:
            return any(r.step >= n for r in steps(load_run(recs_dir), rank=0))

        deadline = time.monotonic() + 120
        while not stepped(INTERVAL + 1) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert stepped(INTERVAL + 1)
        ev = _events(tmp_path)
        assert [e["gen"] for e in ev if e["event"] == "spawn"] == [0], ev
        spares = [e for e in ev if e["event"] == "spares"][-1]
        assert all(_comm(pid) == "lcm-spare" for pid in spares["pids"]), [_comm(p) for p in spares["pids"]]
        os.kill(spares["pids"][1], signal.SIGKILL)
        copy_dir = Path(next(e["dir"] for e in _events(tmp_path) if e["event"] == "host_copy"))
        for manifest in copy_dir.glob("rank*/manifest.json"):
            manifest.unlink()
        time.sleep(0.3)
        rank0 = next(e for e in _events(tmp_path) if e["event"] == "spawn")["pids"][0]
        os.kill(rank0, signal.SIGKILL)
        code = p.wait(timeout=600)
    finally:
        if p.poll() is None:
            p.kill()
    assert code == 0, (tmp_path / "agent.out").read_text()[-4000:]
    ev = _events(tmp_path)
    gen1 = next(e for e in ev if e["event"] == "spawn" and e["gen"] == 1)
    assert gen1["warm"] == [0], gen1
    recs = load_run(tmp_path)
    assert {r.get("source") for r in of_event(recs, "resume", rank=0) if r.attempt == 1} == {"disk"}
    ref = reference.losses()
    got = {r.step: r.get("loss_hex") for r in steps(recs, rank=0)}
    assert all(got[s] == ref[s] for s in got) and max(got) == ITERS
    assert _wait_for_no_leftovers("coldfall") == []
