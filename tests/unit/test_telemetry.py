"""lcm_runner.telemetry against telemetry files written the way the trainer writes them."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from lcm_runner import telemetry
from lcm_runner.contracts import TELEMETRY_DIR, telemetry_file_name


def _write(run: Path, rank: int, records: list[dict], raw_tail: str = "") -> Path:
    d = run / TELEMETRY_DIR
    d.mkdir(parents=True, exist_ok=True)
    path = d / telemetry_file_name(rank)
    with path.open("a") as fh:
        for r in records:
            fh.write(json.dumps({"rank": rank, "attempt": 0, "job": "42", **r}) + "\n")
        fh.write(raw_tail)
    return path


def test_load_run_orders_all_ranks_and_splits_data(tmp_path: Path) -> None:
    _write(tmp_path, 1, [{"ts": 10.5, "event": "step", "step": 1, "loss": 2.0, "step_time_s": 0.5}])
    _write(
        tmp_path,
        0,
        [
            {"ts": 10.0, "event": "start", "world_size": 2},
            {"ts": 10.6, "event": "step", "step": 1, "loss": 2.1, "step_time_s": 0.6},
        ],
    )
    recs = telemetry.load_run(tmp_path)
    assert [(r.ts, r.rank, r.event) for r in recs] == [
        (10.0, 0, "start"),
        (10.5, 1, "step"),
        (10.6, 0, "step"),
    ]
    assert recs[1].data == {"step": 1, "loss": 2.0, "step_time_s": 0.5}
    assert recs[1].step == 1 and recs[0].job == "42"
    assert [r.rank for r in telemetry.steps(recs)] == [1, 0]
    assert [r.ts for r in telemetry.steps(recs, rank=0)] == [10.6]


def test_truncated_and_spliced_lines_are_skipped_and_counted(tmp_path: Path) -> None:
    # A SIGKILLed writer leaves half a record; the restarted writer appends after it on the same line.
    path = _write(
        tmp_path, 0, [{"ts": 1.0, "event": "step", "step": 1, "loss": 1.0}], raw_tail='{"ts": 2.0, "ev'
    )
    _write(tmp_path, 0, [{"ts": 3.0, "event": "resume", "step": 1, "load_s": 0.2}])
    stats = telemetry.ParseStats()
    recs = telemetry.load_run(tmp_path, stats=stats)
    assert [r.event for r in recs] == [
        "step"
    ]  # the spliced line holds the resume record: skipped, not guessed
    assert stats.skipped == {str(path): 1}
    with pytest.raises(telemetry.TelemetryError, match=r"rank0.jsonl:2: not JSON"):
        telemetry.load_run(tmp_path, strict=True)


def test_record_missing_common_field_is_an_error(tmp_path: Path) -> None:
    d = tmp_path / TELEMETRY_DIR
    d.mkdir()
    (d / "rank0.jsonl").write_text('{"ts": 1, "event": "step", "rank": 0, "job": "1"}\n')
    with pytest.raises(telemetry.TelemetryError, match="lacks attempt"):
        telemetry.load_run(tmp_path, strict=True)


def test_missing_run_dir_gives_no_records(tmp_path: Path) -> None:
    assert telemetry.load_run(tmp_path / "nothing") == []


def test_first_step_after(tmp_path: Path) -> None:
    _write(tmp_path, 0, [{"ts": t, "event": "step", "step": i} for i, t in enumerate([1.0, 2.0, 3.0], 1)])
    recs = telemetry.load_run(tmp_path)
    first = telemetry.first_step_after(recs, 2.0)
    assert first is not None and first.step == 3
    assert telemetry.first_step_after(recs, 3.0) is None


def test_follow_sees_records_appended_later_including_new_rank_files(tmp_path: Path) -> None:
    _write(tmp_path, 0, [{"ts": 1.0, "event": "start"}])
    seen: list[str] = []

    def writer() -> None:
        time.sleep(0.3)
        p = _write(tmp_path, 1, [], raw_tail='{"ts": 2.0, "event": "step", "rank": 1, "attempt": 1, ')
        time.sleep(0.3)  # the line is completed later: follow must not parse the half line
        with p.open("a") as fh:
            fh.write('"job": "42", "step": 11}\n')

    t = threading.Thread(target=writer)
    t.start()
    rec = telemetry.follow(
        tmp_path,
        lambda r: r.event == "step" and r.attempt == 1,
        timeout_s=5,
        poll_s=0.05,
        on_record=lambda r: seen.append(r.event),
    )
    t.join()
    assert rec is not None and rec.step == 11 and rec.rank == 1
    assert seen == ["start", "step"]


def test_follow_times_out(tmp_path: Path) -> None:
    _write(tmp_path, 0, [{"ts": 1.0, "event": "start"}])
    t0 = time.monotonic()
    assert telemetry.follow(tmp_path, lambda r: r.event == "exit", timeout_s=0.4, poll_s=0.05) is None
    assert 0.35 < time.monotonic() - t0 < 2.0


def test_follow_from_end_ignores_old_records(tmp_path: Path) -> None:
    _write(tmp_path, 0, [{"ts": 1.0, "event": "step", "step": 1}])
    assert (
        telemetry.follow(tmp_path, lambda r: r.event == "step", timeout_s=0.3, poll_s=0.05, from_start=False)
        is None
    )


def test_reads_what_the_trainer_writer_writes(tmp_path: Path) -> None:
    from lcm_runner.train.telemetry import TelemetryWriter

    w = TelemetryWriter(tmp_path / TELEMETRY_DIR, rank=3, attempt=1, job="77")
    w.emit("step", step=5, loss=1.25, step_time_s=0.1, comm_time_s=0.01)
    w.emit("exit", durable=True, code=75, reason="signal")
    w.close()
    recs = telemetry.load_run(tmp_path, strict=True)
    assert [(r.event, r.rank, r.attempt, r.job) for r in recs] == [("step", 3, 1, "77"), ("exit", 3, 1, "77")]
    assert recs[0].data == {"step": 5, "loss": 1.25, "step_time_s": 0.1, "comm_time_s": 0.01}
    assert telemetry.exit_code(recs, "77") == 75
    assert telemetry.exit_code(recs, "77", since=recs[1].ts + 1) is None
    assert telemetry.exit_code(recs, "other") is None


def test_exit_code_cli(tmp_path: Path) -> None:
    import subprocess
    import sys

    _write(tmp_path, 0, [{"ts": 5.0, "event": "exit", "code": 1}])
    _write(tmp_path, 1, [{"ts": 5.1, "event": "exit", "code": 75}])
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-m", "lcm_runner.telemetry", "exit-code", str(tmp_path), "--job", "42"],
        capture_output=True,
        text=True,
        check=True,
        cwd=root,
    ).stdout
    assert out.strip() == "75"  # a requeue request wins: the ranks only exit 75 after a complete save
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "lcm_runner.telemetry",
            "exit-code",
            str(tmp_path),
            "--job",
            "42",
            "--since",
            "6",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=root,
    ).stdout
    assert out == ""


class _Interrupting:
    """A telemetry file whose write is interrupted by a real SIGUSR1 (delivered to this process, handled
    between two bytecodes inside the write): records how deep writes nest."""

    def __init__(self, fh: Any) -> None:
        self.fh, self.depth, self.max_depth, self.armed = fh, 0, 0, 0

    def write(self, text: str) -> int:
        self.depth += 1
        self.max_depth = max(self.max_depth, self.depth)
        try:
            if self.armed:
                self.armed -= 1
                os.kill(os.getpid(), signal.SIGUSR1)
                for _ in range(1000):  # the handler runs here, while this write is under way
                    pass
            return int(self.fh.write(text))
        finally:
            self.depth -= 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fh, name)


def test_a_signal_during_a_telemetry_write_is_recorded_after_it_not_inside_it(tmp_path: Path) -> None:
    """A rank died with `RuntimeError: reentrant call inside <_io.BufferedWriter ...rank0.jsonl>`: its
    SIGUSR1 handler wrote the signal record while the main thread was writing a step record."""
    from lcm_runner.train.telemetry import TelemetryWriter

    tel = TelemetryWriter(tmp_path, rank=0, attempt=0, job="1")
    fh = _Interrupting(tel._fh)
    tel._fh = fh  # type: ignore[assignment]
    prev = signal.signal(signal.SIGUSR1, lambda s, f: tel.emit_from_signal_handler("signal", name="SIGUSR1"))
    try:
        fh.armed = 1
        tel.emit("step", step=1)
        tel.emit("step", step=2)
        assert fh.max_depth == 1, "the handler wrote inside a write"
        tel.emit_from_signal_handler("signal", name="SIGTERM")  # no write under way: written at once
    finally:
        signal.signal(signal.SIGUSR1, prev)
        tel.close()
    recs = [json.loads(ln) for ln in (tmp_path / "rank0.jsonl").read_text().splitlines()]
    assert [(r["event"], r.get("step", r.get("name"))) for r in recs] == [
        ("step", 1),
        ("signal", "SIGUSR1"),
        ("step", 2),
        ("signal", "SIGTERM"),
    ]
