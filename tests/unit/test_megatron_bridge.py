"""The Megatron-LM workload's launch path: the user's arguments plus the runner's (argv.py), and the
per-rank bridge (bridge.py) around the project's CPU stand-in for pretrain_gpt.py (a real subprocess
trained with torch; tests/support/fake_megatron)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lcm_runner.config import ConfigError, from_dict
from lcm_runner.contracts import ExitCode
from lcm_runner.workloads.megatron_lm import argv as mlm

FAKE = Path(__file__).resolve().parents[1] / "support" / "fake_megatron" / "pretrain_gpt.py"
USER = [
    *("--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4"),
    *("--seq-length", "64", "--max-position-embeddings", "64", "--micro-batch-size", "2"),
    *("--global-batch-size", "2", "--vocab-size", "128", "--lr", "1e-3", "--mock-data"),
    *("--tokenizer-type", "NullTokenizer"),
]


def test_compose_adds_and_overrides_only_the_owned_flags_and_says_so() -> None:
    user = [*USER, "--save", "/mine", "--log-interval", "10", "--save-interval=4", "--exit-signal-handler"]
    out, changes = mlm.compose(user, save="/ck", load=None, save_interval=4, train_iters=30, gpu=True)
    got = {c.flag: (c.action, c.user, c.runner) for c in changes}
    assert got["--save"] == ("overridden", "/mine", "/ck")
    assert got["--log-interval"] == ("overridden", "10", "1")
    assert "--save-interval" not in got  # the user's value is the runner's: no change to report
    assert got["--load"] == ("added", None, "/ck")
    assert got["--distributed-backend"] == ("added", None, "nccl")
    assert "--exit-signal-handler" not in got
    assert out.count("--save") == 1 and out[out.index("--save") + 1] == "/ck"
    assert out[: len(USER)] == USER  # the user's flags first, in their order, unchanged
    assert "--exit-signal-handler" in out
    plain, ch = mlm.compose(user, save="/ck", load=None, save_interval=4, train_iters=30, gpu=False,
                            signal_handler=False)  # fmt: skip
    assert "--exit-signal-handler" not in plain
    assert ("--exit-signal-handler", "removed") in {(c.flag, c.action) for c in ch}


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--num-layers"], "--num-layers needs a value"),
        (["stray", "--bf16"], "'stray' is not a --flag"),
        (["--bf16", "stray"], "'stray' is not a --flag"),
    ],
)
def test_bad_user_args_are_refused_by_name(args: list[str], why: str) -> None:
    with pytest.raises(mlm.ArgsError, match=why):
        mlm.parse(args)


def test_run_config_checks_the_workload_before_anything_runs() -> None:
    base = {"nodes": 2, "procs_per_node": 2}
    with pytest.raises(ConfigError) as e:
        from_dict({**base, "workload": {"kind": "nemo"}})
    assert "workload.kind: 'nemo' is not one of lcm, megatron-lm" in str(e.value)
    with pytest.raises(ConfigError) as e:
        from_dict({**base, "workload": {"kind": "megatron-lm", "path": "rel", "args": ["--num-layers", "x"]}})
    msg = str(e.value)
    assert "workload.path: 'rel'" in msg
    assert "--num-layers 'x' is not an integer" in msg
    assert "--seq-length is required" in msg
    args = [*USER, "--tensor-model-parallel-size", "3"]
    with pytest.raises(ConfigError) as e:
        from_dict({**base, "workload": {"kind": "megatron-lm", "path": "/opt/m", "args": args}})
    assert "tensor x pipeline parallel = 3 x 1 does not divide the world size 4" in str(e.value)
    # the global batch must split into micro batches over data parallel (4 ranks, TP=PP=1: DP 4)
    with pytest.raises(ConfigError) as e:
        from_dict({**base, "workload": {"kind": "megatron-lm", "path": "/opt/m", "args": USER}})
    assert "--global-batch-size 2 is not divisible by micro batch 2 x data parallel 4" in str(e.value)
    user8 = [a if a != "2" or USER[i - 1] != "--global-batch-size" else "8" for i, a in enumerate(USER)]
    ok = from_dict({**base, "workload": {"kind": "megatron-lm", "path": "/opt/m", "args": user8}})
    assert ok.train_module == "lcm_runner.workloads.megatron_lm.bridge"
    assert from_dict(base).train_module == "lcm_runner.train"


def _bridge(tmp: Path, iters: int, *extra: str, sleep: str = "0") -> subprocess.Popen[bytes]:
    args, _ = mlm.compose(
        [*USER, *extra], save=str(tmp / "ck"), load=None, save_interval=4, train_iters=iters, gpu=False
    )
    env = {
        **os.environ,
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29917",
        "FAKE_MEGATRON_STEP_SLEEP_S": sleep,
    }
    cmd = [
        sys.executable,
        "-m",
        "lcm_runner.workloads.megatron_lm.bridge",
        "--telemetry-dir",
        str(tmp / "tel"),
    ]
    cmd += ["--seq-length", "64", "--", sys.executable, str(FAKE), *args]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _records(tmp: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp / "tel" / "rank0.jsonl").read_text().splitlines()]


def test_bridge_turns_megatron_lines_into_telemetry_and_resumes(tmp_path: Path) -> None:
    p = _bridge(tmp_path, 6)
    out = p.communicate(timeout=120)[0].decode()
    assert p.returncode == 0, out
    assert "successfully saved checkpoint from iteration       4" in out  # the child's lines, unchanged
    recs = _records(tmp_path)
    steps = [r for r in recs if r["event"] == "step"]
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5, 6]
    assert all(r["tokens_per_s"] == pytest.approx(2 * 64 / r["step_time_s"]) for r in steps)
    ends = [r for r in recs if r["event"] == "ckpt_end"]
    assert [r["step"] for r in ends] == [4, 6] and all(r["total_s"] > 0 and r["bytes"] > 0 for r in ends)
    assert recs[-2]["event"] == "log_parse" and recs[-2]["malformed"] == 0 and recs[-2]["events"] >= 10
    assert recs[-1] == {**recs[-1], "event": "exit", "code": 0, "child_code": 0}
    ref = {r["step"]: r["loss"] for r in steps}
    # resume: the tracker says 6; train to 8 from it
    (tmp_path / "tel" / "rank0.jsonl").unlink()
    p = _bridge(tmp_path, 8)
    out = p.communicate(timeout=120)[0].decode()
    assert p.returncode == 0, out
    recs = _records(tmp_path)
    resume = next(r for r in recs if r["event"] == "resume")
    assert resume["step"] == 6 and resume["load_s"] is not None
    assert [r["step"] for r in recs if r["event"] == "step"] == [7, 8]
    assert set(ref) == set(range(1, 7))


def test_sigterm_becomes_a_checkpoint_and_the_requeue_code(tmp_path: Path) -> None:
    p = _bridge(tmp_path, 200, sleep="0.2")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        tel = tmp_path / "tel" / "rank0.jsonl"
        if tel.is_file() and '"step"' in tel.read_text():
            break
        time.sleep(0.1)
    p.send_signal(signal.SIGTERM)
    out = p.communicate(timeout=60)[0].decode()
    assert p.returncode == int(ExitCode.REQUEUE), out
    assert "exiting program after receiving SIGTERM." in out
    recs = _records(tmp_path)
    assert any(r["event"] == "signal" and r["name"] == "SIGTERM" for r in recs)
    saved = [r["step"] for r in recs if r["event"] == "ckpt_end"]
    assert saved and (tmp_path / "ck" / "latest_checkpointed_iteration.txt").read_text().strip() == str(
        saved[-1]
    )
    assert recs[-1]["event"] == "exit" and recs[-1]["code"] == int(ExitCode.REQUEUE)
