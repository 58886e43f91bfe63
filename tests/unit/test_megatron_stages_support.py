"""The stages' side of a foreign (Megatron-LM) trainer: the reporting rank of step records, Megatron-LM's
checkpoint completeness, the un-averaging of the second line after every start, the bridge's exit code,
the rank processes the fault stage kills, and the report's workload section."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from lcm_runner import telemetry
from lcm_runner.config import from_dict
from lcm_runner.contracts import ExitCode
from lcm_runner.launch.procs import Proc
from lcm_runner.report import workload as report_workload
from lcm_runner.stages import resume
from lcm_runner.stages.common import losses_by_step
from lcm_runner.telemetry import Record
from lcm_runner.workloads.megatron_lm import checkpoint, logparse, logrecords
from lcm_runner.workloads.megatron_lm.bridge import exit_code

FIXTURES = Path(__file__).parent / "fixtures" / "megatron_lm"
USER = [
    *("--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32"),
    *("--micro-batch-size", "2", "--global-batch-size", "8", "--lr", "1e-2", "--mock-data"),
]


def _rec(event: str, rank: int, step: int, ts: float, **data: object) -> Record:
    return Record(ts=ts, event=event, rank=rank, attempt=0, job="j", data={"step": step, **data})


# ----------------------------------------------------------------------------- reporting rank


def test_the_reporting_rank_is_the_lowest_that_wrote_steps() -> None:
    megatron = [_rec("step", 3, s, float(s), loss=10.0 - s) for s in (1, 2, 3)]
    megatron += [_rec("ckpt_end", 0, 2, 2.5)]
    assert telemetry.step_rank(megatron) == 3
    assert losses_by_step(megatron) == {1: 9.0, 2: 8.0, 3: 7.0}
    lcm = [_rec("step", r, 1, 1.0 + r, loss=5.0 + r) for r in (1, 0, 2)]
    assert telemetry.step_rank(lcm) == 0
    assert [r.rank for r in telemetry.reporting_steps(lcm)] == [0]
    assert losses_by_step(lcm) == {1: 5.0}
    assert telemetry.step_rank([]) == 0 and losses_by_step([]) == {}


# ----------------------------------------------------------------------------- checkpoint completeness


def _dist_iter(root: Path, it: int, *, shards: int = 2, dcp: bool = True, config: bool = True) -> Path:
    d = root / f"iter_{it:07d}"
    d.mkdir(parents=True)
    for r in range(shards):
        (d / f"__{r}_0.distcp").write_bytes(b"x")
    if dcp:
        (d / ".metadata").write_bytes(b"m")
    if config:
        (d / "metadata.json").write_text('{"sharded_backend": "torch_dist"}')
    return d


def test_a_megatron_iteration_dir_is_whole_only_once_its_metadata_json_is_written(tmp_path: Path) -> None:
    assert checkpoint.iter_complete(_dist_iter(tmp_path, 4))
    assert not checkpoint.iter_complete(_dist_iter(tmp_path, 8, config=False))  # killed mid-save
    assert not checkpoint.iter_complete(_dist_iter(tmp_path, 12, dcp=False))  # shards without DCP metadata
    legacy = tmp_path / "iter_0000016" / "mp_rank_00"
    legacy.mkdir(parents=True)
    assert not checkpoint.iter_complete(legacy.parent)
    (legacy / "model_optim_rng.pt").write_bytes(b"pt")
    assert checkpoint.iter_complete(legacy.parent)
    # the resume stage's view of the directory, for each workload
    assert resume.iter_dirs(tmp_path, foreign=True) == {4: True, 8: False, 12: False, 16: True}
    assert resume.iter_dirs(tmp_path) == {4: False, 8: False, 12: False, 16: False}  # no lcm marker


# ----------------------------------------------------------------------------- un-averaging


def _steps(path: Path) -> dict[int, dict]:
    events, _ = logparse.parse_file(path)
    recs = logrecords.to_telemetry(events, seq_length=4096, rank=0, attempt=0, job="j")
    return {r["step"]: r for r in recs if r["event"] == "step"}


def test_the_second_line_of_a_run_is_unaveraged_and_matches_the_real_logs_timestamps() -> None:
    """Real H200 log: line 2 prints the mean of iterations 1 and 2 (1081.6 ms after 1935.2 ms); the
    iteration-2 time alone is 228.0 ms, which the two lines' printed timestamps confirm (228.2 ms)."""
    steps = _steps(FIXTURES / "pretrain_gpt.h200.sync-save.log")
    s1, s2, s3 = steps[1], steps[2], steps[3]
    assert "loss_printed" not in s1 and "loss_printed" not in s3
    assert s2["step_time_printed_s"] == pytest.approx(1.0816)
    assert s2["step_time_s"] == pytest.approx(2 * 1.0816 - 1.9352)
    assert s2["step_time_s"] == pytest.approx(s2["ts"] - s1["ts"], abs=2e-3)
    assert s2["loss_printed"] == pytest.approx(10.40360)
    assert s2["loss"] == pytest.approx(2 * 10.40360 - 10.60051)
    assert s2["losses"]["lm loss"] == s2["loss"]
    assert s2["tokens_per_s"] == pytest.approx(2 * 4096 / s2["step_time_s"])
    # every later line is its own interval, left as printed
    assert all("loss_printed" not in r for it, r in steps.items() if it > 2)


def test_every_restart_unaverages_its_own_second_line() -> None:
    line = (
        " [2026-12-02 10:00:0{s}.000000] iteration {it:8d}/      20 | consumed samples: {c:12d} | elapsed"
        " time per iteration (ms): {ms:.1f} | learning rate: 1.000000E-03 | global batch size:     2 |"
        " lm loss: {loss:.6E} | loss scale: 1.0 | grad norm: 1.000 | number of skipped iterations:   0 |"
        " number of nan iterations:   0 |"
    )
    lines = [
        line.format(s=1, it=5, c=10, ms=900.0, loss=5.0),
        line.format(s=2, it=6, c=12, ms=550.0, loss=4.5),  # mean of 5 and 6: 6 alone = 200 ms, 4.0
        line.format(s=3, it=7, c=14, ms=210.0, loss=3.9),
        "  loading distributed checkpoint from /ck at iteration 6",
        "  successfully loaded checkpoint from /ck [ t 1/1, pp 1/1 ] at iteration 6",
        line.format(s=5, it=7, c=14, ms=800.0, loss=3.95),
        line.format(s=6, it=9, c=18, ms=400.0, loss=3.8),  # log interval 2 here: mean over 7..9 (3)
    ]
    events = logparse.parse_lines(lines)[0]
    recs = [
        r
        for r in logrecords.to_telemetry(events, seq_length=1, rank=0, attempt=0, job="j")
        if r["event"] == "step"
    ]
    got = [(r["step"], round(r["loss"], 6), round(r["step_time_s"], 6)) for r in recs]
    assert got == [
        (5, 5.0, 0.9),
        (6, 4.0, 0.2),
        (7, 3.9, 0.21),
        (7, 3.95, 0.8),
        (9, round((3.8 * 3 - 3.95) / 2, 6), round((0.4 * 3 - 0.8) / 2, 6)),
    ]


# ----------------------------------------------------------------------------- bridge exit codes


@pytest.mark.parametrize(
    ("child", "requested", "signals", "code"),
    [
        (0, None, [], ExitCode.OK),
        (0, "signal", ["SIGTERM"], ExitCode.REQUEUE),
        # saved, printed its exit line, then gloo/NCCL threads aborted the interpreter's exit
        (-int(signal.SIGABRT), "signal", ["SIGTERM"], ExitCode.REQUEUE),
        (1, "signal", ["SIGTERM"], ExitCode.REQUEUE),
        (0, "iteration", [], ExitCode.OK),  # --exit-interval: done as asked
        (-int(signal.SIGKILL), None, [], ExitCode.FAILURE),
        (1, None, ["SIGTERM"], ExitCode.FAILURE),  # signalled, but it never said it saved
        (2, None, [], ExitCode.BAD_ARGS),
    ],
)
def test_the_bridge_exit_code(child: int, requested: str | None, signals: list[str], code: ExitCode) -> None:
    got, reason = exit_code(child, requested, signals)
    assert got == int(code), reason
    assert reason


# ----------------------------------------------------------------------------- fault targets


@pytest.mark.parametrize(
    ("comm", "cmdline", "trainer"),
    [
        ("lcm-trainer", "python -m lcm_runner.launch.zygote", True),  # forked by our agent
        ("python", "/v/bin/python -u -m lcm_runner.train --save /ck", True),
        ("python", "/v/bin/python -m lcm_runner.workloads.megatron_lm.bridge --telemetry-dir /t -- x", True),
        (
            "python",
            "/v/bin/python -m torch.distributed.run -m lcm_runner.workloads.megatron_lm.bridge",
            False,
        ),
        ("python", "/v/bin/python /m/pretrain_gpt.py --save /ck", False),  # the bridge's child: dies with it
        ("python", "/v/bin/python -m", False),
    ],
)
def test_the_rank_processes_a_trainer_kill_targets(comm: str, cmdline: str, trainer: bool) -> None:
    assert Proc(1, 0, comm, cmdline, "n").is_trainer is trainer


# ----------------------------------------------------------------------------- report section


def test_the_report_section_names_the_script_the_changes_and_the_malformed_lines() -> None:
    cfg = from_dict(
        {
            "nodes": 2,
            "procs_per_node": 2,
            "workload": {"kind": "megatron-lm", "path": "/opt/m", "args": USER},
        }
    )
    parses = [
        _rec("log_parse", 0, 0, 1.0, lines=100, events=12, malformed=0, malformed_lines=[]),
        _rec(
            "log_parse",
            3,
            0,
            1.0,
            lines=90,
            events=30,
            malformed=1,
            malformed_lines=["7: iteration 5/ x"],
        ),
    ]
    sec = report_workload.section(cfg, parses)
    assert sec is not None
    assert sec.script == "/opt/m/pretrain_gpt.py" and sec.loss_rel_tol == 0.02
    assert "--exit-signal-handler (added)" in sec.arg_changes
    assert (sec.ranks_parsed, sec.lines, sec.events, sec.malformed) == (2, 190, 42, 1)
    assert sec.malformed_lines == ["job j rank 3 line 7: iteration 5/ x"]
    assert report_workload.section(from_dict({"nodes": 2, "procs_per_node": 2}), []) is None


def test_a_real_resumed_megatron_log_loads_then_unaverages_its_second_line() -> None:
    """Real H200 log of a resume (Megatron-LM core_v0.19.0 through the bridge): the load lines, then
    iteration 11 (1st after the load) and 12, whose printed 1499.4 ms is the mean with 11's 2712.4 ms;
    12 alone is 286.4 ms, and the two lines' timestamps are 286.5 ms apart."""
    events, stats = logparse.parse_file(FIXTURES / "pretrain_gpt.h200.resume.log")
    assert stats.malformed == 0
    recs = logrecords.to_telemetry(events, seq_length=4096, rank=0, attempt=0, job="j")
    resumed = [r for r in recs if r["event"] == "resume"]
    assert [(r["step"], r["path"]) for r in resumed] == [(10, "/tmp/lcm-ckpt/resume")]
    steps = {r["step"]: r for r in recs if r["event"] == "step"}
    assert sorted(steps) == list(range(11, 21))
    assert steps[12]["step_time_printed_s"] == pytest.approx(1.4994)
    assert steps[12]["step_time_s"] == pytest.approx(2 * 1.4994 - 2.7124)
    assert steps[12]["step_time_s"] == pytest.approx(steps[12]["ts"] - steps[11]["ts"], abs=2e-3)
    assert steps[11]["loss"] == pytest.approx(9.278255)  # = the uninterrupted run's step 11 (baseline)
