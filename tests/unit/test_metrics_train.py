"""lcm_runner.metrics.train and `metrics train`: telemetry written by the trainer's own writer class
(lcm_runner.train.telemetry.TelemetryWriter) for three ranks, two on this node and one elsewhere, with a
requeue (attempt 1), a truncated last line, a restart spliced onto a killed writer's partial line, a
checkpoint, non-finite steps, another job's records; read incrementally and published as the contract
(docs/monitoring.md) names it, checked by prometheus_client's parser and the real promtool."""

from __future__ import annotations

import math
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from lcm_runner.contracts import TELEMETRY_DIR, ExitCode
from lcm_runner.metrics import exposition
from lcm_runner.metrics.train import STEP_BUCKETS, TrainCollector
from lcm_runner.train.telemetry import TelemetryWriter

ROOT = Path(__file__).resolve().parents[2]
PROMTOOL = ROOT / ".cache" / "tools" / "bin" / "promtool"
JOB = "4242"
HERE, THERE = "node-a", "node-b"

# The contract's training metrics (docs/monitoring.md, "Training metrics").
CONTRACT = {
    "lcm_train_running": "gauge",
    "lcm_train_writer_heartbeat_timestamp_seconds": "gauge",
    "lcm_train_last_step": "gauge",
    "lcm_train_last_step_timestamp_seconds": "gauge",
    "lcm_train_step_seconds": "gauge",
    "lcm_train_step_duration_seconds": "histogram",
    "lcm_train_step_seconds_total": "counter",
    "lcm_train_step_seconds_baseline": "gauge",
    "lcm_train_loss": "gauge",
    "lcm_train_local_loss": "gauge",
    "lcm_train_tokens_per_second": "gauge",
    "lcm_train_comm_seconds_total": "counter",
    "lcm_train_comm_fraction": "gauge",
    "lcm_train_checkpoint_duration_seconds": "gauge",
    "lcm_train_checkpoint_blocking_seconds": "gauge",
    "lcm_train_checkpoint_bytes": "gauge",
    "lcm_train_checkpoint_bytes_total": "counter",
    "lcm_train_last_checkpoint_step": "gauge",
    "lcm_train_last_checkpoint_timestamp_seconds": "gauge",
    "lcm_train_restarts": "gauge",
    "lcm_train_nonfinite_steps_total": "counter",
    "lcm_train_checkpoints_rejected_total": "counter",
    "lcm_train_rank_info": "gauge",
}


def step_time(rank: int, step: int) -> float:
    return round(0.01 * step + 0.001 * rank, 6)


def start(w: TelemetryWriter, host: str, local_rank: int, gpu: int | None = None) -> None:
    w.emit(
        "start", world_size=3, tp=1, pp=1, ep=1, dp=3, resumed_from=None, host=host, pid=os.getpid(),
        local_rank=local_rank, gpu=gpu, durable=True,
    )  # fmt: skip


def step(w: TelemetryWriter, s: int, loss: float | None = None, comm: bool = True) -> None:
    dt = step_time(w.rank, s)
    rec: dict[str, float] = dict(
        loss=3.0 - 0.01 * s if loss is None else loss,
        local_loss=3.0 - 0.01 * s + 0.1 * w.rank,
        step_time_s=dt,
        tokens_per_s=round(4096 / dt, 3),
    )
    if comm:
        rec.update(comm_time_s=round(0.3 * dt, 6), comm_grad_reduce_s=round(0.2 * dt, 6))
        rec.update(comm_loss_allreduce_s=round(rec["comm_time_s"] - rec["comm_grad_reduce_s"], 6))
    w.emit("step", step=s, **rec)


def ckpt(w: TelemetryWriter, s: int, nbytes: int) -> None:
    w.emit("ckpt_begin", step=s, path=f"/ckpt/iter_{s:07d}", durable=True)
    w.emit(
        "ckpt_end", step=s, blocking_s=0.25, total_s=1.5, bytes=nbytes, path=f"/ckpt/iter_{s:07d}",
        asynchronous=True, durable=True,
    )  # fmt: skip


def write_job(run_dir: Path) -> None:
    """rank 0 (here): attempt 0 30 steps, a save at 20, a skipped non-finite step, exit 75 (requeue);
    attempt 1 resumes from 20, one rejected checkpoint, a non-finite step, steps 21..24 (the last with
    a NaN loss), running. rank 1 (here): attempt 0, 10 steps, running, no comm timing. rank 2: on
    another host. Another job's records in rank 0's file."""
    tel = run_dir / TELEMETRY_DIR
    other = TelemetryWriter(tel, 0, 0, "999")
    start(other, HERE, 0)
    step(other, 1)
    other.close()
    w = TelemetryWriter(tel, 0, 0, JOB)
    start(w, HERE, 0)
    for s in range(1, 31):
        if s == 27:
            w.emit("nonfinite", step=s, what="loss", skipped=1, max_skips=3, durable=True)
            continue
        step(w, s)
        if s == 20:
            ckpt(w, 20, 123456)
    w.emit("signal", name="SIGUSR1")
    w.emit("exit", code=int(ExitCode.REQUEUE), reason="signal: checkpointed, requeue", durable=True)
    w.close()
    w = TelemetryWriter(tel, 0, 1, JOB)
    start(w, HERE, 0)
    w.emit("ckpt_rejected", step=30, path="/ckpt/iter_0000030", file="x", reason="digest", durable=True)
    w.emit("resume", step=20, load_s=0.5, path="/ckpt/iter_0000020")
    w.emit("nonfinite", step=21, what="grad_norm", skipped=1, max_skips=3, durable=True)
    for s in range(21, 25):
        step(w, s, loss=float("nan") if s == 24 else None)
    w.close()
    w = TelemetryWriter(tel, 1, 0, JOB)
    start(w, HERE, 1, gpu=3)
    for s in range(1, 11):
        step(w, s, comm=False)
    w.close()
    w = TelemetryWriter(tel, 2, 0, JOB)
    start(w, THERE, 0)
    for s in range(1, 31):
        step(w, s)
    w.close()


def parse(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def series(got: dict, name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {labels: v for (n, labels), v in got.items() if n == name}


def one(got: dict, name: str, **labels: str) -> float:
    want = frozenset({"job_id": JOB, **labels}.items())
    assert (name, want) in got, (name, labels, sorted(series(got, name)))
    return got[(name, want)]


def promtool_check(text: str) -> None:
    if not PROMTOOL.is_file():
        pytest.fail(f"{PROMTOOL} is missing: run scripts/bootstrap (it unpacks promtool and amtool)")
    r = subprocess.run([str(PROMTOOL), "check", "metrics"], input=text, capture_output=True, text=True)
    assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), (r.stdout, r.stderr)


def collect(run_dir: Path, host: str = HERE) -> tuple[TrainCollector, str]:
    c = TrainCollector(run_dir, JOB, host)
    c.poll()
    return c, exposition.render(c.families(now=1.7e9))


def test_every_contract_metric_is_published_with_its_type_and_promtool_accepts_it(tmp_path: Path) -> None:
    write_job(tmp_path)
    _, text = collect(tmp_path)
    declared = dict(ln.split()[2:4] for ln in text.splitlines() if ln.startswith("# TYPE "))
    assert declared == CONTRACT
    # the parser reads every family back with that type (it names a counter without its _total)
    parsed = sorted((f.name, f.type) for f in text_string_to_metric_families(text))
    assert parsed == sorted(
        (n.removesuffix("_total") if t == "counter" else n, t) for n, t in CONTRACT.items()
    )
    promtool_check(text)
    for labels in {ls for (_, ls) in parse(text)}:
        assert not {"job", "instance"} & {k for k, _ in labels}


def test_this_nodes_ranks_current_attempts_only(tmp_path: Path) -> None:
    write_job(tmp_path)
    _, text = collect(tmp_path)
    got = parse(text)
    running = series(got, "lcm_train_running")
    assert running == {
        frozenset({"job_id": JOB, "rank": "0", "attempt": "1"}.items()): 1,
        frozenset({"job_id": JOB, "rank": "1", "attempt": "0"}.items()): 1,
    }  # rank 2 is another node's; rank 0's attempt 0 is over (its series are gone, not frozen)
    assert all(dict(ls)["rank"] != "2" for (_, ls) in got if "rank" in dict(ls))
    assert all(dict(ls).get("job_id") == JOB for (_, ls) in got)  # job 999's records ignored
    assert one(got, "lcm_train_restarts", rank="0") == 1
    assert one(got, "lcm_train_restarts", rank="1") == 0
    assert one(got, "lcm_train_writer_heartbeat_timestamp_seconds") == 1.7e9
    # rank 2 is published by its own node's writer
    _, there = collect(tmp_path, THERE)
    assert set(series(parse(there), "lcm_train_running")) == {
        frozenset({"job_id": JOB, "rank": "2", "attempt": "0"}.items())
    }


def test_step_values_histogram_and_baseline(tmp_path: Path) -> None:
    write_job(tmp_path)
    _, text = collect(tmp_path)
    got = parse(text)
    r0 = {"rank": "0", "attempt": "1"}
    r1 = {"rank": "1", "attempt": "0"}
    assert one(got, "lcm_train_last_step", **r0) == 24
    assert one(got, "lcm_train_step_seconds", **r0) == step_time(0, 24)
    assert math.isnan(one(got, "lcm_train_loss", **r0))  # the NaN of the last step, as NaN
    assert one(got, "lcm_train_local_loss", **r1) == pytest.approx(3.0 - 0.1 + 0.1)
    assert one(got, "lcm_train_tokens_per_second", **r1) == round(4096 / step_time(1, 10), 3)
    assert one(got, "lcm_train_last_step_timestamp_seconds", **r1) > 1e9
    # attempt 1's histogram: its own 4 steps (the process started its counters at 0)
    times = [step_time(0, s) for s in range(21, 25)]
    buckets = {
        dict(ls)["le"]: v
        for ls, v in series(got, "lcm_train_step_duration_seconds_bucket").items()
        if dict(ls)["rank"] == "0"
    }
    for b in STEP_BUCKETS:
        assert buckets[exposition.format_bound(b)] == sum(t <= b for t in times)
    assert buckets["+Inf"] == 4 == one(got, "lcm_train_step_duration_seconds_count", **r0)
    total = one(got, "lcm_train_step_seconds_total", **r0)
    assert total == pytest.approx(sum(times)) and total == one(
        got, "lcm_train_step_duration_seconds_sum", **r0
    )
    # baseline: median of attempt 0's steps 6..25, published on the current attempt; none for rank 1
    assert one(got, "lcm_train_step_seconds_baseline", **r0) == pytest.approx(
        statistics.median(step_time(0, s) for s in range(6, 26))
    )
    assert not [ls for ls in series(got, "lcm_train_step_seconds_baseline") if dict(ls)["rank"] == "1"]


def test_comm_checkpoint_nonfinite_rejected_and_rank_info(tmp_path: Path) -> None:
    write_job(tmp_path)
    _, text = collect(tmp_path)
    got = parse(text)
    r0 = {"rank": "0", "attempt": "1"}
    r1 = {"rank": "1", "attempt": "0"}
    grad = sum(round(0.2 * step_time(0, s), 6) for s in range(21, 25))
    assert one(got, "lcm_train_comm_seconds_total", **r0, collective="grad_reduce") == pytest.approx(grad)
    loss_ar = one(got, "lcm_train_comm_seconds_total", **r0, collective="loss_allreduce")
    assert loss_ar == pytest.approx(sum(0.1 * step_time(0, s) for s in range(21, 25)), abs=1e-5)
    assert one(got, "lcm_train_comm_fraction", **r0) == pytest.approx(0.3, abs=1e-4)
    # rank 1 measured no communication: no comm series at all
    assert not [ls for ls in series(got, "lcm_train_comm_seconds_total") if dict(ls)["rank"] == "1"]
    assert not [ls for ls in series(got, "lcm_train_comm_fraction") if dict(ls)["rank"] == "1"]
    # the last completed save (attempt 0's, step 20) is still the newest checkpoint of attempt 1
    assert one(got, "lcm_train_last_checkpoint_step", **r0) == 20
    assert one(got, "lcm_train_checkpoint_bytes", **r0) == 123456
    assert one(got, "lcm_train_checkpoint_duration_seconds", **r0) == 1.5
    assert one(got, "lcm_train_checkpoint_blocking_seconds", **r0) == 0.25
    assert one(got, "lcm_train_last_checkpoint_timestamp_seconds", **r0) > 1e9
    assert one(got, "lcm_train_checkpoint_bytes_total", **r0) == 0  # attempt 1 has saved nothing
    assert not [ls for ls in series(got, "lcm_train_last_checkpoint_step") if dict(ls)["rank"] == "1"]
    assert one(got, "lcm_train_nonfinite_steps_total", **r0) == 1  # attempt 1's own
    assert one(got, "lcm_train_checkpoints_rejected_total", **r0) == 1
    assert one(got, "lcm_train_nonfinite_steps_total", **r1) == 0
    info = {dict(ls)["rank"]: dict(ls) for ls in series(got, "lcm_train_rank_info")}
    assert info["0"] == {
        "job_id": JOB, "rank": "0", "attempt": "1", "local_rank": "0", "world_size": "3",
        "tp": "1", "pp": "1", "ep": "1", "dp": "3",
    }  # fmt: skip
    assert info["1"]["gpu"] == "3" and info["1"]["local_rank"] == "1"


def test_attempt_0_alone_before_the_requeue(tmp_path: Path) -> None:
    tel = tmp_path / TELEMETRY_DIR
    w = TelemetryWriter(tel, 0, 0, JOB)
    start(w, HERE, 0)
    for s in range(1, 25):
        step(w, s)
    c, text = collect(tmp_path)
    got = parse(text)
    assert not series(got, "lcm_train_step_seconds_baseline")  # absent until step 25
    step(w, 25)
    c.poll()
    got = parse(exposition.render(c.families(now=1.0)))
    assert one(got, "lcm_train_step_seconds_baseline", rank="0", attempt="0") == pytest.approx(
        statistics.median(step_time(0, s) for s in range(6, 26))
    )
    ckpt(w, 25, 1000)
    ckpt(w, 30, 500)
    c.poll()
    got = parse(exposition.render(c.families(now=1.0)))
    assert one(got, "lcm_train_checkpoint_bytes_total", rank="0", attempt="0") == 1500
    assert one(got, "lcm_train_last_checkpoint_step", rank="0", attempt="0") == 30
    w.close()


def test_incremental_reads_truncated_line_retried_and_spliced_restart_kept(tmp_path: Path) -> None:
    tel = tmp_path / TELEMETRY_DIR
    w = TelemetryWriter(tel, 0, 0, JOB)
    start(w, HERE, 0)
    for s in range(1, 4):
        step(w, s)
    c = TrainCollector(tmp_path, JOB, HERE)
    c.poll()
    size = w.path.stat().st_size
    # a line being written: the first half now, the rest later (never parsed half-written)
    step(w, 4)
    whole = w.path.read_bytes()[size:]
    w.close()
    with open(w.path, "r+b") as fh:
        fh.truncate(size)
    with open(w.path, "ab") as fh:
        fh.write(whole[: len(whole) // 2])
    assert c.poll() == 0
    cur = c.ranks[0].current
    assert cur is not None and cur.last_step == 3 and cur.steps == 3
    assert c.tails[w.path].state.offset == size and c.tails[w.path].state.skipped == 0
    with open(w.path, "ab") as fh:
        fh.write(whole[len(whole) // 2 :])
    assert c.poll() == 1
    cur = c.ranks[0].current
    assert cur is not None and cur.last_step == 4 and cur.steps == 4 and cur.step_hist.count == 4
    assert c.poll() == 0  # nothing new: nothing applied twice
    # SIGKILL mid-write: a partial record, then the restarted process appends its start to that line
    with open(w.path, "ab") as fh:
        fh.write(b'{"ts":1.0,"event":"step","rank":0,"attempt":0,"job":"4242","step":5,"lo')
    w = TelemetryWriter(tel, 0, 1, JOB)
    start(w, HERE, 0)
    step(w, 5)
    assert c.poll() == 2
    rs = c.ranks[0]
    assert rs.starts == 2 and rs.current is not None and rs.current.attempt == 1
    assert rs.current.last_step == 5 and rs.current.steps == 1
    assert c.tails[w.path].state.salvaged == 1
    got = parse(exposition.render(c.families(now=1.0)))
    assert one(got, "lcm_train_restarts", rank="0") == 1
    assert set(series(got, "lcm_train_running")) == {
        frozenset({"job_id": JOB, "rank": "0", "attempt": "1"}.items())
    }
    # a line that is damaged beyond that is skipped and counted, not guessed at
    with open(w.path, "ab") as fh:
        fh.write(b'{"ts":2.0,"event":"st\n')
    step(w, 6)
    assert c.poll() == 1 and c.tails[w.path].state.skipped == 1
    w.close()


def test_a_rank_that_moves_to_another_host_moves_to_its_writer(tmp_path: Path) -> None:
    tel = tmp_path / TELEMETRY_DIR
    w = TelemetryWriter(tel, 1, 0, JOB)
    start(w, HERE, 1)
    step(w, 1)
    w.close()
    here = TrainCollector(tmp_path, JOB, HERE)
    there = TrainCollector(tmp_path, JOB, THERE)
    here.poll(), there.poll()
    assert [r.rank for r in here.local_ranks()] == [1] and there.local_ranks() == []
    w = TelemetryWriter(tel, 1, 1, JOB)  # requeued onto the other node
    start(w, THERE, 0)
    w.close()
    here.poll(), there.poll()
    assert here.local_ranks() == [] and [r.rank for r in there.local_ranks()] == [1]
    assert there.ranks[1].starts == 2


def test_all_exited_distinguishes_final_codes(tmp_path: Path) -> None:
    tel = tmp_path / TELEMETRY_DIR
    ws = [TelemetryWriter(tel, r, 0, JOB) for r in (0, 1)]
    for r, w in enumerate(ws):
        start(w, HERE, r)
    c = TrainCollector(tmp_path, JOB, HERE)
    assert c.all_exited() == (False, False)  # nothing known yet
    c.poll()
    assert c.all_exited() == (False, False)
    ws[0].emit("exit", code=0, reason="finished")
    c.poll()
    assert c.all_exited() == (False, False)
    ws[1].emit("exit", code=1, reason="RuntimeError")  # the agent may restart it in place
    c.poll()
    assert c.all_exited() == (True, False)
    w = TelemetryWriter(tel, 1, 1, JOB)
    start(w, HERE, 1)
    c.poll()
    assert c.all_exited() == (False, False)
    w.emit("exit", code=int(ExitCode.REQUEUE), reason="signal")
    c.poll()
    assert c.all_exited() == (True, True)
    got = parse(exposition.render(c.families(now=1.0)))
    assert set(series(got, "lcm_train_running").values()) == {0}


def test_a_replaced_file_is_read_again_from_its_start(tmp_path: Path) -> None:
    tel = tmp_path / TELEMETRY_DIR
    w = TelemetryWriter(tel, 0, 0, JOB)
    start(w, HERE, 0)
    for s in range(1, 6):
        step(w, s)
    w.close()
    c = TrainCollector(tmp_path, JOB, HERE)
    c.poll()
    w.path.unlink()
    w = TelemetryWriter(tel, 0, 0, JOB)
    start(w, HERE, 0)
    step(w, 1)
    w.close()
    c.poll()
    rs = c.ranks[0]
    assert rs.starts == 1 and rs.current is not None and rs.current.steps == 1


# ----------------------------------------------------------------------------- the command


def _cmd(tmp_path: Path, out: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "lcm_runner.metrics", "train", "--run-dir", str(tmp_path / "run"),
        "--job-id", JOB, "--out", str(out), "--host", HERE, *extra,
    ]  # fmt: skip


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def test_once_end_to_end_both_entry_points(tmp_path: Path) -> None:
    write_job(tmp_path / "run")
    (tmp_path / "tf").mkdir()
    out = tmp_path / "tf" / "lcm_train.prom"
    r = subprocess.run(_cmd(tmp_path, out, "--once"), capture_output=True, text=True, env=_env(), timeout=60)
    assert r.returncode == 0 and not r.stderr, r.stderr
    text = out.read_text()
    promtool_check(text)
    got = parse(text)
    assert one(got, "lcm_train_running", rank="0", attempt="1") == 1
    assert sorted(p.name for p in out.parent.iterdir()) == ["lcm_train.prom"]  # no tmp left
    out2 = tmp_path / "tf" / "other.prom"
    argv = [sys.executable, "-m", "lcm_runner", "metrics", *_cmd(tmp_path, out2, "--once")[3:]]
    r = subprocess.run(argv, capture_output=True, text=True, env=_env(), timeout=60)
    assert r.returncode == 0, r.stderr
    assert set(series(parse(out2.read_text()), "lcm_train_last_step")) == set(
        series(got, "lcm_train_last_step")
    )


def test_missing_output_directory_is_one_line_and_exit_0(tmp_path: Path) -> None:
    write_job(tmp_path / "run")
    out = tmp_path / "no-such-dir" / "lcm_train.prom"
    r = subprocess.run(_cmd(tmp_path, out), capture_output=True, text=True, env=_env(), timeout=30)
    assert r.returncode == 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "no-such-dir" in lines[0] and "not publishing" in lines[0], r.stderr
    assert not out.parent.exists()


def _wait_for(path: Path, needle: str, timeout: float = 20) -> str:
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        if path.exists():
            text = path.read_text()
            if needle in text:
                return text
        time.sleep(0.05)
    raise AssertionError(f"{needle!r} not in {path} after {timeout} s:\n{text}")


def _heartbeat(text: str) -> float:
    return one(parse(text), "lcm_train_writer_heartbeat_timestamp_seconds")


def test_sigterm_writes_running_0_and_exits_0_and_sigusr1_is_ignored(tmp_path: Path) -> None:
    tel = tmp_path / "run" / TELEMETRY_DIR
    w = TelemetryWriter(tel, 0, 0, JOB)
    start(w, HERE, 0)
    step(w, 1)
    (tmp_path / "tf").mkdir()
    out = tmp_path / "tf" / "lcm_train.prom"
    proc = subprocess.Popen(_cmd(tmp_path, out, "--interval-s", "0.2"), env=_env(), stderr=subprocess.PIPE)
    try:
        running = f'lcm_train_running{{job_id="{JOB}",rank="0",attempt="0"}} 1\n'
        first = _wait_for(out, running)
        step(w, 2)  # picked up while it runs
        _wait_for(out, f'lcm_train_last_step{{job_id="{JOB}",rank="0",attempt="0"}} 2\n')
        # Slurm's --signal=USR1 reaches every process of the step: the writer must survive it
        proc.send_signal(signal.SIGUSR1)
        time.sleep(0.6)
        assert proc.poll() is None
        assert _heartbeat(out.read_text()) > _heartbeat(first)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=5)
        assert time.monotonic() - t0 < 5
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == 0, proc.stderr.read() if proc.stderr else ""
    text = out.read_text()
    assert f'lcm_train_running{{job_id="{JOB}",rank="0",attempt="0"}} 0\n' in text
    promtool_check(text)
    assert sorted(p.name for p in out.parent.iterdir()) == ["lcm_train.prom"]
    w.close()


def test_ends_by_itself_when_every_rank_exited_with_a_final_code(tmp_path: Path) -> None:
    tel = tmp_path / "run" / TELEMETRY_DIR
    ws = [TelemetryWriter(tel, r, 0, JOB) for r in (0, 1)]
    for r, w in enumerate(ws):
        start(w, HERE, r)
        step(w, 1)
    (tmp_path / "tf").mkdir()
    out = tmp_path / "tf" / "lcm_train.prom"
    proc = subprocess.Popen(_cmd(tmp_path, out, "--interval-s", "0.2"), env=_env())
    try:
        _wait_for(out, f'lcm_train_running{{job_id="{JOB}",rank="1",attempt="0"}} 1\n')
        ws[0].emit("exit", code=0, reason="finished")
        ws[1].emit("exit", code=1, reason="RuntimeError")  # restartable: it must wait for a new start
        time.sleep(2.0)
        assert proc.poll() is None
        w = TelemetryWriter(tel, 1, 1, JOB)
        start(w, HERE, 1)
        _wait_for(out, f'lcm_train_running{{job_id="{JOB}",rank="1",attempt="1"}} 1\n')
        w.emit("exit", code=0, reason="finished")
        rc = proc.wait(timeout=10)  # two intervals after every rank's final exit
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == 0
    got = parse(out.read_text())
    assert set(series(got, "lcm_train_running").values()) == {0}
    assert one(got, "lcm_train_restarts", rank="1") == 1


# ----------------------------------------------------------------------------- the trainer's side


@pytest.mark.parametrize(
    ("device", "env", "want"),
    [
        ("cuda", {"LOCAL_RANK": "2", "CUDA_VISIBLE_DEVICES": "4,5,6,7"}, 6),
        ("cuda", {"LOCAL_RANK": "1"}, 1),  # every GPU visible: the local rank's own
        ("cuda", {"LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": "GPU-8f2c,GPU-11ab"}, "GPU-8f2c"),
        ("cuda", {"LOCAL_RANK": "3", "CUDA_VISIBLE_DEVICES": "0,1"}, None),
        ("cpu", {"LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": "3"}, None),
    ],
)
def test_start_record_gpu_is_the_visible_entry_at_local_rank(
    device: str, env: dict[str, str], want: int | str | None
) -> None:
    from lcm_runner.train.trainer import physical_gpu

    assert physical_gpu(device, env) == want


def test_sweep_removes_only_other_writers_stale_files(tmp_path: Path) -> None:
    from lcm_runner.metrics.loop import sweep_stale

    now = 1_000_000.0
    own = tmp_path / "lcm_train_7.prom"
    files = {
        "lcm_train_7.prom": 5000,  # its own file, however old, is never removed
        "lcm_train_6.prom": 601,
        "lcm_train_5.prom": 599,
        "lcm_train_4.prom.123.tmp": 601,
        "lcm_train_3.txt": 5000,  # not a textfile-collector file
        "lcm_slurm.prom": 5000,  # another family
        "node.prom": 5000,
    }
    for name, age in files.items():
        (tmp_path / name).write_text("x\n")
        os.utime(tmp_path / name, (now - age, now - age))
    (tmp_path / "lcm_train_dir.prom").mkdir()  # not a file: left alone
    os.utime(tmp_path / "lcm_train_dir.prom", (now - 5000, now - 5000))
    removed = sweep_stale(own, "lcm_train", 600, now=now)
    assert sorted(p.name for p in removed) == ["lcm_train_4.prom.123.tmp", "lcm_train_6.prom"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        {
            "lcm_train_7.prom",
            "lcm_train_5.prom",
            "lcm_train_3.txt",
            "lcm_slurm.prom",
            "node.prom",
            "lcm_train_dir.prom",
        }
    )
    assert sweep_stale(tmp_path / "missing" / "lcm_train_1.prom", "lcm_train", 600) == []
