"""lcm_runner.workloads.megatron_lm.logparse on real Megatron-LM core_v0.19.0 logs from an H200.

The logs are `shared/fixtures/megatron-lm/` (see its README); the malformed, truncated, non-finite and
launcher-prefixed lines are derived from their lines here; the load/exit lines Megatron prints only on a
resume or an early exit are written from its format strings (megatron/training/checkpointing.py,
training.py); `fixtures/megatron_lm/async_save.derived.log` is a truly asynchronous save (its README).
"""

from __future__ import annotations

import json
import math
import re
import statistics
from datetime import datetime
from pathlib import Path

import pytest

from lcm_runner import telemetry
from lcm_runner.contracts import EVENT_CKPT_BEGIN, EVENT_CKPT_END, EVENT_RESUME, EVENT_STEP
from lcm_runner.workloads.megatron_lm import logparse as lp

# the real H200 logs, copied from ../shared/fixtures/megatron-lm (see fixtures/megatron_lm/REAL_LOGS.md)
SHARED = Path(__file__).parent / "fixtures" / "megatron_lm"
SYNC_LOG = SHARED / "pretrain_gpt.h200.sync-save.log"
ASYNC_LOG = SHARED / "pretrain_gpt.h200.async-save.log"
DERIVED_ASYNC_LOG = Path(__file__).parent / "fixtures" / "megatron_lm" / "async_save.derived.log"


TS = "2026-12-01 07:18:01.154314"


def local_ts(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S.%f").timestamp()


def lines_of(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def iteration_line(lines: list[str], n: int) -> tuple[int, str]:
    """(0-based index, text) of the real "iteration n/ 40 |" line."""
    for i, line in enumerate(lines):
        if re.match(rf" \[[^\]]+\] iteration +{n}/ ", line):
            return i, line
    raise AssertionError(f"no iteration {n} in the log")


def iterations(events: list[lp.Event]) -> list[lp.Iteration]:
    return [e for e in events if isinstance(e, lp.Iteration)]


def only(events: list[lp.Event]) -> lp.Event:
    assert len(events) == 1, events
    return events[0]


def feed_one(line: str, parser: lp.MegatronLogParser | None = None) -> lp.Event:
    return only((parser or lp.MegatronLogParser()).feed(line))


def assert_malformed(line: str, reason_part: str = "") -> lp.MalformedLine:
    parser = lp.MegatronLogParser()
    assert parser.feed(line) == []
    assert (parser.stats.malformed, parser.stats.ignored, parser.stats.events) == (1, 0, 0), line
    bad = parser.stats.malformed_lines[0]
    assert (bad.lineno, bad.text) == (1, line.rstrip("\r\n"))
    assert reason_part in bad.reason
    return bad


def save_events(events: list[lp.Event]) -> list[tuple]:
    return [
        (type(e).__name__, e.iteration, e.path)
        for e in events
        if isinstance(e, lp.CkptSaveBegin | lp.CkptSaveEnd | lp.CkptSaveScheduled)
    ]


# ---------------------------------------------------------------------------------------------------
# The real logs


@pytest.mark.parametrize("path", [SYNC_LOG, ASYNC_LOG], ids=["sync", "async"])
def test_real_log_parses_with_no_malformed_line(path: Path) -> None:
    events, stats = lp.parse_file(path)
    assert stats.malformed == 0, stats.malformed_lines
    assert stats.lines == len(lines_of(path))
    assert stats.lines == stats.events + stats.ignored + stats.malformed
    assert stats.events == len(events)
    its = iterations(events)
    assert [it.iteration for it in its] == list(range(1, 41))
    assert {(it.train_iters, it.global_batch_size) for it in its} == {(40, 2)}
    assert [it.consumed_samples for it in its] == [2 * n for n in range(1, 41)]
    assert all(set(it.losses) == {"lm loss", "load_balancing_loss"} for it in its)
    assert all(it.extra == {} and it.skipped_iterations == 0 == it.nan_iterations for it in its)
    # nothing but iterations and saves: no load, no "start from random", no exit
    assert all(isinstance(e, lp.Iteration | lp.CkptSaveBegin | lp.CkptSaveEnd) for e in events)


def test_sync_log_median_step_time() -> None:
    its = iterations(lp.parse_file(SYNC_LOG)[0])
    ms = [it.step_time_s * 1000 for it in its if 5 <= it.iteration <= 40]
    assert len(ms) == 36
    median = statistics.median(ms)
    assert median == pytest.approx(108.9, abs=0.05)
    assert median == pytest.approx(108.95, abs=1e-9)  # 36 values: the mean of 108.8 and 109.1


def test_saves_of_both_logs() -> None:
    sync_events = lp.parse_file(SYNC_LOG)[0]
    assert save_events(sync_events) == [
        ("CkptSaveBegin", 40, "/ckpt/run1"),
        ("CkptSaveEnd", 40, "/ckpt/run1"),
    ]
    begin = next(e for e in sync_events if isinstance(e, lp.CkptSaveBegin))
    assert (begin.fmt, begin.ts) == ("torch_dist", local_ts("2026-12-01 07:17:44.932970"))
    assert save_events(lp.parse_file(ASYNC_LOG)[0]) == [
        ("CkptSaveBegin", 20, "/ckpt/run2"),
        ("CkptSaveEnd", 20, "/ckpt/run2"),
        ("CkptSaveBegin", 40, "/ckpt/run2"),
        ("CkptSaveEnd", 40, "/ckpt/run2"),
    ]


def test_first_iteration_exactly_as_printed() -> None:
    it = iterations(lp.parse_file(SYNC_LOG)[0])[0]
    assert it == lp.Iteration(
        ts=local_ts("2026-12-01 07:17:40.234164"),
        iteration=1,
        train_iters=40,
        consumed_samples=2,
        step_time_s=1.9352,
        learning_rate=float("9.750000E-05"),
        global_batch_size=2,
        losses={"lm loss": float("1.060051E+01"), "load_balancing_loss": 0.0},
        loss=float("1.060051E+01"),
        loss_scale=1.0,
        grad_norm=2.163,
        skipped_iterations=0,
        nan_iterations=0,
        extra={},
    )
    assert it.loss == 10.60051


# ---------------------------------------------------------------------------------------------------
# Damaged lines: counted, kept with their line numbers, never guessed at


def test_truncated_iteration_lines_are_malformed_with_their_line_numbers() -> None:
    lines = lines_of(SYNC_LOG)
    cuts = {  # iteration -> where its line is cut
        3: lambda s: s[:12],  # inside the timestamp
        4: lambda s: s[: s.index("]") + 1],  # the timestamp alone
        5: lambda s: s[: s.index("] ") + 7],  # "... itera"
        6: lambda s: s[: s.index("/")],  # "iteration        6"
        7: lambda s: s[: s.index("consumed samples:") + 17],  # a field without its value
        8: lambda s: s[: s.index("| lm loss")],  # at a '|', the losses and the counters gone
        9: lambda s: s[: s.index("lm loss: ") + 13],  # inside a number
        10: lambda s: s[:-2],  # only the last " |" gone
        11: lambda s: s[: s.index("| number of nan")],  # at a '|', only the nan counter gone
    }
    expected = []
    for n, cut in cuts.items():
        i, line = iteration_line(lines, n)
        lines[i] = cut(line)
        assert lines[i] != line
        expected.append((i + 1, lines[i]))
    events, stats = lp.parse_lines(lines)
    assert stats.malformed == len(cuts)
    assert [(m.lineno, m.text) for m in stats.malformed_lines] == expected
    assert all(m.reason for m in stats.malformed_lines)
    assert [it.iteration for it in iterations(events)] == [n for n in range(1, 41) if n not in cuts]
    assert stats.lines == stats.events + stats.ignored + stats.malformed


@pytest.mark.parametrize(
    ("old", "new", "why"),
    [
        ("lm loss: 9.988714E+00", "lm loss: 9.988714E+0O", "is not a number"),
        ("lm loss: 9.988714E+00", "lm loss: 9_988.714", "is not a number"),  # float() would take it
        ("grad norm: 1.895", "grad norm: --1.895", "is not a number"),
        ("(ms): 191.4", "(ms): fast", "is not a number"),
        ("consumed samples:            6", "consumed samples:          6.5", "is not an integer"),
        ("global batch size:     2", "global batch size:    -2", "is not an integer"),
        ("number of nan iterations:   0", "number of nan iterations: nan", "is not an integer"),
        ("| elapsed time per iteration (ms): 191.4 ", "", "missing elapsed time per iteration (ms)"),
        ("| loss scale: 1.0 ", "| loss scale: 1.0 | loss scale: 2.0 ", "printed twice"),
        ("| grad norm: 1.895 ", "| grad norm 1.895 ", "is not 'name: value'"),
        ("iteration        3/      40", "iteration        3 of 40", "head"),
    ],
)
def test_malformed_numbers_and_fields(old: str, new: str, why: str) -> None:
    _, line = iteration_line(lines_of(SYNC_LOG), 3)
    assert old in line
    assert_malformed(line.replace(old, new), why)


@pytest.mark.parametrize(
    "line",
    [
        "[2026-12-01 07:17:44.932970] saving checkpoint at iteration      40 to /ckpt/run1 in torch_d",
        "[2026-12-01 07:17:44.932970] saving checkpoint at iteration      4O to /ckpt/run1 in torch format",
        "[2026-12-01 07:17:44.932970] sav",
        "[2026-12-01 07:17:44.932970] ",
        "[2026-12-01 07:17:44.9329",
        "  [2026-12-01 07:18:01.152404] successfully saved checkpoint from iteration 40 to /c [ t 1/1, gtp",
        "  [2026-12-01 07:18:01.152404] successfully saved checkpoint from iteration      40 to /ckpt/run1",
        "  [2026-12-01 07:18:01.152404] scheduled an async checkpoint save at iteration",
        "[2026-13-01 07:17:44.932970] saving checkpoint at iteration      40 to /ckpt/run1 in torch format",
        " loading distributed checkpoint from /ckpt/run1 at iter",
        "  successfully loaded checkpoint from /ckpt/run1 [ t 1/1, gtp_re",
        "  successfully loaded checkpoint from /ckpt/run1 [ t 1/1, gtp_remat 1/1, p 1/1 ] at iteration",
        "[exiting program at iteration 30] datet",
        "[exiting program at iteration thirty] datetime: 2026-12-01 07:18:01.154314 ",
    ],
)
def test_damaged_checkpoint_and_exit_lines_are_malformed(line: str) -> None:
    assert_malformed(line)


def test_a_record_in_the_middle_of_a_line_is_malformed() -> None:
    _, line = iteration_line(lines_of(SYNC_LOG), 12)
    assert_malformed("WARNING: interleaved output" + line, "does not start its line")
    assert_malformed("x [2026-12-01 07:17:44.932970] saving checkpoint at iteration 40 to /c in torch format")


def test_only_the_first_20_malformed_lines_are_kept() -> None:
    _, line = iteration_line(lines_of(SYNC_LOG), 3)
    lines = ["ordinary line", *([line[:-2]] * 25)]
    events, stats = lp.parse_lines(lines)
    assert events == []
    assert (stats.lines, stats.ignored, stats.malformed) == (26, 1, 25)
    assert [m.lineno for m in stats.malformed_lines] == list(range(2, 22))


# ---------------------------------------------------------------------------------------------------
# Non-finite and skipped iterations


def test_non_finite_values_parse_to_nan_and_inf() -> None:
    _, line = iteration_line(lines_of(SYNC_LOG), 3)
    nan_loss = feed_one(line.replace("lm loss: 9.988714E+00", "lm loss: nan"))
    assert isinstance(nan_loss, lp.Iteration)
    assert math.isnan(nan_loss.loss) and math.isnan(nan_loss.losses["lm loss"])
    inf_loss = feed_one(line.replace("lm loss: 9.988714E+00", "lm loss: INF"))  # what {:.6E} prints
    assert inf_loss.loss == math.inf
    nan_norm = feed_one(line.replace("grad norm: 1.895", "grad norm: nan"))
    assert math.isnan(nan_norm.grad_norm) and nan_norm.loss == float("9.988714E+00")


def test_megatron_skipped_iteration_form() -> None:
    """An fp16 overflow: the loss is not accumulated (the interval's average over no iteration prints
    0), the optimizer returns no grad norm, the loss scale halves, both counters count it."""
    _, line = iteration_line(lines_of(SYNC_LOG), 3)
    skipped = (
        line.replace("lm loss: 9.988714E+00", "lm loss: 0.000000E+00")
        .replace("loss scale: 1.0", "loss scale: 32768.0")
        .replace(" grad norm: 1.895 |", "")
        .replace("skipped iterations:   0", "skipped iterations:   1")
        .replace("nan iterations:   0", "nan iterations:   1")
    )
    it = feed_one(skipped)
    assert (it.loss, it.grad_norm, it.loss_scale) == (0.0, None, 32768.0)
    assert (it.skipped_iterations, it.nan_iterations) == (1, 1)
    rec = only(lp.to_telemetry([it], seq_length=4096, rank=0, attempt=0, job="j"))
    assert (rec["skipped_iterations"], rec["nan_iterations"]) == (1, 1)
    assert "grad_norm" not in rec


def test_optional_and_extra_fields() -> None:
    _, line = iteration_line(lines_of(SYNC_LOG), 3)
    richer = (
        line.replace(" learning rate: 9.250000E-05 |", "")
        .replace("| elapsed", "| skipped samples:            4 | elapsed")
        .replace("(ms): 191.4 |", "(ms): 191.4 | throughput per GPU (TFLOP/s/GPU): 412.3 |")
        .replace("load_balancing_loss: 0.000000E+00 |", "mtp_1 loss: 9.1E+00 | z_loss: 1.5E-03 |")
        .replace("grad norm: 1.895 |", "grad norm: 1.895 | num zeros: 12 | params norm: 301.250 |")
    )
    it = feed_one(richer)
    assert it.learning_rate is None
    assert it.losses == {"lm loss": 9.988714, "mtp_1 loss": 9.1, "z_loss": 0.0015}
    assert it.extra == {
        "skipped samples": 4.0,
        "throughput per GPU (TFLOP/s/GPU)": 412.3,
        "num zeros": 12.0,
        "params norm": 301.25,
    }


# ---------------------------------------------------------------------------------------------------
# Launchers, line ends, and ordinary lines


@pytest.mark.parametrize("prefix", ["0: ", "  12: ", "[default0]:", "[rank3]:", "1: [default1]:"])
def test_launcher_prefixes(prefix: str) -> None:
    lines = lines_of(SYNC_LOG)
    _, line = iteration_line(lines, 40)
    begin = next(x for x in lines if "saving checkpoint at iteration" in x)
    bare = [feed_one(line), feed_one(begin)]
    assert [feed_one(prefix + line), feed_one(prefix + begin)] == bare
    assert_malformed(prefix + line[:-2])


def test_crlf_and_trailing_whitespace(tmp_path: Path) -> None:
    _, line = iteration_line(lines_of(SYNC_LOG), 40)
    bare = feed_one(line)
    assert feed_one(line + "\r\n") == bare
    assert feed_one(line + " \t \n") == bare
    crlf = tmp_path / "crlf.log"
    crlf.write_bytes(SYNC_LOG.read_bytes().replace(b"\n", b"\r\n"))
    events, stats = lp.parse_file(crlf)
    assert stats.malformed == 0
    assert events == lp.parse_file(SYNC_LOG)[0]


def test_ordinary_lines_that_mention_iterations_are_ignored() -> None:
    real = [  # from the real log: the argument dump, the memory reports, a warning
        "  train_iters ..................................... 40",
        "Number of virtual stages per pipeline stage: None",
        "[Rank 0] (before save_checkpoint for iteration 40) memory (MB) | allocated: 6634.13 | max "
        "allocated: 15649.85 | reserved: 7492.00 | max reserved: 17740.00",
        "[Rank 0] (after 1 iterations) memory (MB) | allocated: 6634.13 | max allocated: 13180.46 | "
        "reserved: 14662.00 | max reserved: 14662.00",
        "Overwriting rerun_state_machine.current_iteration from -1 to 0...",
        "[after training is done] datetime: 2026-12-01 07:18:01.154314 ",
    ]
    sync_text = SYNC_LOG.read_text(encoding="utf-8")
    assert all(line in sync_text for line in real)
    megatron_source = [  # other lines Megatron-LM core_v0.19.0 prints
        " validation loss at iteration 1000 | lm loss value: 5.123456E+00 | lm loss PPL: 1.678901E+02 | ",
        "Evaluating iter 1/10",
        "setting training iterations to 40",
        "WARNING: Starting a checkpoint save before previous has finished. Consider increasing the "
        "checkpoint interval.",
        "  [2026-12-01 07:18:30.934856] saving wgrads from iteration      20",
        "  successfully deleted checkpoint from iteration      20 at /ckpt/run2",
        "saving dataloader checkpoint at iteration 20 to /ckpt/run2/dataloader",
        "[rank0]:[W1201 07:17:36.832543549 ProcessGroupNCCL.cpp:5188] Guessing device ID based on global",
        "",
    ]
    events, stats = lp.parse_lines(real + megatron_source)
    assert events == []
    assert (stats.ignored, stats.malformed) == (len(real) + len(megatron_source), 0), stats.malformed_lines


# ---------------------------------------------------------------------------------------------------
# Loads, "start from random", exits (Megatron's format strings)

LOAD_BEGIN = " loading distributed checkpoint from /ckpt/run1 at iteration 40"
LOAD_END = "  successfully loaded checkpoint from /ckpt/run1 [ t 1/1, gtp_remat 1/1, p 1/1 ] at iteration 40"


def test_checkpoint_load_lines() -> None:
    assert feed_one(LOAD_BEGIN) == lp.CkptLoadBegin(None, 40, "/ckpt/run1")
    assert feed_one(" loading checkpoint from /ckpt/my run at iteration 7") == lp.CkptLoadBegin(
        None, 7, "/ckpt/my run"
    )
    assert feed_one(" loading release distributed checkpoint from /ckpt/rel") == lp.CkptLoadBegin(
        None, None, "/ckpt/rel"
    )
    assert feed_one(LOAD_END) == lp.CkptLoadEnd(None, 40, "/ckpt/run1")


def test_resume_record_load_time_from_the_parsers_clock() -> None:
    ticks = iter([100.0, 102.5])
    parser = lp.MegatronLogParser(clock=lambda: next(ticks))
    events, _ = lp.parse_lines([LOAD_BEGIN, "some line in between", LOAD_END], parser)
    assert events == [lp.CkptLoadBegin(100.0, 40, "/ckpt/run1"), lp.CkptLoadEnd(102.5, 40, "/ckpt/run1")]
    rec = only(lp.to_telemetry(events, seq_length=4096, rank=0, attempt=1, job="j"))
    assert (rec["event"], rec["ts"], rec["step"], rec["load_s"], rec["path"]) == (
        EVENT_RESUME,
        102.5,
        40,
        2.5,
        "/ckpt/run1",
    )
    # a file read after the fact: no timestamps, so no load time and ts from now()
    events = lp.parse_lines([LOAD_BEGIN, LOAD_END])[0]
    after = only(lp.to_telemetry(events, seq_length=1, rank=0, attempt=0, job="j", now=lambda: 7.0))
    assert (after["ts"], after["load_s"]) == (7.0, None)


def test_no_checkpoint_to_load() -> None:
    tracker = "/ckpt/none/latest_checkpointed_iteration.txt"
    events, stats = lp.parse_lines(
        [
            f"WARNING: could not find the metadata file {tracker}",  # non-persistent: no event
            "    will not load any non-persistent checkpoint",
            f"WARNING: could not find the metadata file {tracker}",
            "    will not load any checkpoints and will start from random",
        ]
    )
    assert events == [lp.NoCheckpoint(None, "/ckpt/none", tracker)]
    assert (stats.events, stats.ignored, stats.malformed) == (1, 3, 0)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            f"[exiting program after receiving SIGTERM.] datetime: {TS} ",
            lp.ExitRequested(local_ts(TS), "signal"),
        ),
        (
            f"[exiting program at iteration 30] datetime: {TS} ",
            lp.ExitRequested(local_ts(TS), "iteration", 30),
        ),
        (
            f"[exiting program after 12.50481 minutes] datetime: {TS} ",
            lp.ExitRequested(local_ts(TS), "duration", minutes=12.50481),
        ),
        ("Exiting during evaluation, timelimit reached", lp.ExitRequested(None, "duration")),
    ],
)
def test_exit_lines(line: str, expected: lp.ExitRequested) -> None:
    assert feed_one("0: " + line) == expected


def test_iteration_line_without_timestamp() -> None:
    _, line = iteration_line(lines_of(SYNC_LOG), 5)
    it = feed_one(line[line.index("iteration") :])
    assert (it.ts, it.iteration, it.step_time_s) == (None, 5, 0.1383)


# ---------------------------------------------------------------------------------------------------
# to_telemetry


def records_of(path: Path, **kw) -> list[dict]:
    return lp.to_telemetry(lp.parse_file(path)[0], seq_length=4096, rank=0, attempt=0, job="1234", **kw)


def test_step_records() -> None:
    steps = [r for r in records_of(SYNC_LOG) if r["event"] == EVENT_STEP]
    assert [r["step"] for r in steps] == list(range(1, 41))
    r10 = steps[9]
    assert r10["tokens_per_s"] == pytest.approx(2 * 4096 / 0.1205)
    assert r10["tokens_per_s"] == pytest.approx(67983.4, abs=0.1)
    assert (r10["ts"], r10["loss"], r10["step_time_s"], r10["grad_norm"]) == (
        local_ts("2026-12-01 07:17:41.637188"),
        float("8.866400E+00"),
        0.1205,
        2.533,
    )
    assert (r10["rank"], r10["attempt"], r10["job"]) == (0, 0, "1234")


def test_sync_save_blocks_for_its_whole_time() -> None:
    ckpt = [r for r in records_of(SYNC_LOG) if r["event"] in (EVENT_CKPT_BEGIN, EVENT_CKPT_END)]
    assert [(r["event"], r["step"], r["path"]) for r in ckpt] == [
        (EVENT_CKPT_BEGIN, 40, "/ckpt/run1"),
        (EVENT_CKPT_END, 40, "/ckpt/run1"),
    ]
    end = ckpt[1]
    assert end["total_s"] == pytest.approx(16.219434, abs=1e-6)  # 07:17:44.932970 -> 07:18:01.152404
    assert end["blocking_s"] == end["total_s"]
    assert end["bytes"] is None


def test_the_real_async_log_saved_synchronously() -> None:
    """--async-save was switched off by Megatron (no --use-persistent-ckpt-worker): both saves end before
    the next iteration, so they blocked for their whole time."""
    ends = [r for r in records_of(ASYNC_LOG) if r["event"] == EVENT_CKPT_END]
    assert [(r["step"], r["total_s"], r["blocking_s"]) for r in ends] == [
        (20, pytest.approx(17.704827, abs=1e-6), pytest.approx(17.704827, abs=1e-6)),
        (40, pytest.approx(5.25466, abs=1e-6), pytest.approx(5.25466, abs=1e-6)),
    ]
    assert "async_save ...................................... False" in ASYNC_LOG.read_text()


def test_async_save_blocks_until_training_resumes() -> None:
    events, stats = lp.parse_file(DERIVED_ASYNC_LOG)
    assert stats.malformed == 0
    assert save_events(events) == [
        ("CkptSaveBegin", 20, "/ckpt/run2"),
        ("CkptSaveScheduled", 20, "/ckpt/run2"),
        ("CkptSaveEnd", 20, "/ckpt/run2"),
    ]
    recs = lp.to_telemetry(events, seq_length=4096, rank=0, attempt=0, job="j")
    end = only([r for r in recs if r["event"] == EVENT_CKPT_END])
    # begin 07:18:30.934856; iteration 21 printed at 07:18:31.540000 after 124.1 ms -> 07:18:31.415900
    assert end["blocking_s"] == pytest.approx(0.481044, abs=1e-6)
    assert end["total_s"] == pytest.approx(0.865144, abs=1e-6)  # end 07:18:31.800000


def test_records_round_trip_through_the_telemetry_reader(tmp_path: Path) -> None:
    events = lp.parse_file(DERIVED_ASYNC_LOG)[0] + lp.parse_lines([LOAD_BEGIN, LOAD_END])[0]
    recs = lp.to_telemetry(events, seq_length=4096, rank=3, attempt=2, job="77", now=lambda: 5.0)
    assert {r["event"] for r in recs} == {EVENT_STEP, EVENT_CKPT_BEGIN, EVENT_CKPT_END, EVENT_RESUME}
    for i, rec in enumerate(recs):
        back = telemetry.parse_line(json.dumps(rec), f"x:{i}")
        assert back is not None
        assert back.to_dict() == rec
        assert (back.rank, back.attempt, back.job, back.step) == (3, 2, "77", rec["step"])
    path = tmp_path / "telemetry" / "rank3.jsonl"
    path.parent.mkdir()
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    stats = telemetry.ParseStats()
    loaded = telemetry.load_run(tmp_path, strict=True, stats=stats)
    assert len(loaded) == len(recs) and stats.total_skipped == 0
    assert [r.step for r in telemetry.steps(loaded)] == [19, 20, 21, 22, 23, 24]
