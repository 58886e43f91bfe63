"""The CPU stand-in for Megatron-LM's pretrain_gpt.py (tests/support/fake_megatron): its console lines
against a real Megatron-LM core_v0.19.0 log, its checkpoint layout and tracker, resume, the exits.

Each run is a subprocess (`python pretrain_gpt.py`, or torchrun for 2 ranks), a tiny model on a CPU.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "support" / "fake_megatron" / "pretrain_gpt.py"
FIXTURE = Path(__file__).parent / "fixtures" / "megatron_lm" / "pretrain_gpt.h200.sync-save.log"
TIMEOUT_S = 120
RANKS = "[ t 1/1, gtp_remat 1/1, p 1/1 ]"  # checkpointing.py's save/load lines, TP = PP = 1
MODEL = [
    "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--ffn-hidden-size", "64",
    "--seq-length", "16", "--max-position-embeddings", "16", "--micro-batch-size", "2",
    "--global-batch-size", "4", "--vocab-size", "512", "--lr", "1e-2", "--seed", "1234", "--mock-data",
    "--tokenizer-type", "NullTokenizer", "--transformer-impl", "local", "--log-interval", "1",
]  # fmt: skip
# Megatron's training_log format (training.py), field by field, as a regex; it must match the real line too.
LINE_RE = re.compile(
    r"^ \[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}\] iteration (?P<it>[ \d]{8})/(?P<total>[ \d]{8}) \|"
    r" consumed samples: (?P<consumed>[ \d]{12}) \| elapsed time per iteration \(ms\): \d+\.\d \|"
    r" learning rate: (?P<lr>\d\.\d{6}E[+-]\d\d) \| global batch size: [ \d]{5} \|"
    r" lm loss: (?P<loss>\d\.\d{6}E[+-]\d\d) \|(?P<moe> load_balancing_loss: \d\.\d{6}E[+-]\d\d \|)?"
    r" loss scale: \d+\.\d \| grad norm: (?P<norm>\d+\.\d{3}) \|"
    r" number of skipped iterations: [ \d]{3} \| number of nan iterations: [ \d]{3} \|$"
)


@dataclass
class Out:
    rc: int
    stdout: str
    stderr: str

    def iterations(self) -> dict[int, re.Match[str]]:
        found = {}
        for line in self.stdout.splitlines():
            if " iteration " in line and "consumed samples" in line:
                m = LINE_RE.match(line)
                assert m, f"not Megatron's iteration line format: {line!r}"
                assert int(m["it"]) not in found, f"iteration {m['it']} printed twice"
                found[int(m["it"])] = m
        return found


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", FAKE_MEGATRON_STEP_SLEEP_S="0")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    env.update(extra)
    return env


def run(args: list[str], cwd: Path, **env: str) -> Out:
    p = subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=cwd, env=_env(**env), capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    return Out(p.returncode, p.stdout, p.stderr)


def fields(line: str) -> list[str]:
    """The field names of an iteration line, in order ("iteration", "consumed samples", ...)."""
    parts = [p.strip() for p in line.split("] ", 1)[1].split("|") if p.strip()]
    return [p.split(":")[0] if ":" in p else p.split()[0] for p in parts]


class Reader:
    """Collects a process's stdout lines in a thread, so a test can wait for one."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self.proc = proc
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def wait_for(self, pattern: str, timeout: float = 60.0) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if any(re.search(pattern, line) for line in list(self.lines)):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"no line matching {pattern!r}; got:\n{''.join(self.lines)[-2000:]}")

    def text(self) -> str:
        self.thread.join(timeout=10)
        return "".join(self.lines)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Out:
    """8 uninterrupted iterations, MoE flags as the fixture's command has them, a save every 4."""
    d = tmp_path_factory.mktemp("ref")
    out = run([*MODEL, "--num-experts", "4", "--moe-router-topk", "2", "--train-iters", "8",
               "--save", str(d / "ckpt"), "--save-interval", "4"], d)  # fmt: skip
    assert out.rc == 0, out.stderr[-2000:]
    return out


def test_iteration_line_is_megatrons(reference: Out, tmp_path: Path) -> None:
    real = next(line for line in FIXTURE.read_text().splitlines() if " iteration " in line)
    assert LINE_RE.match(real), "the regex does not describe the real Megatron line"
    ours = reference.iterations()
    assert sorted(ours) == list(range(1, 9))
    assert fields(ours[1].string) == fields(real)
    assert ours[8]["total"] == "       8" and ours[8]["consumed"] == f"{32:12d}"
    assert ours[8]["lr"] == "0.000000E+00" and ours[4]["lr"] == "5.000000E-03"  # linear decay to --min-lr
    # No --num-experts: no load_balancing_loss field (training_log adds the MoE string only with experts).
    # --log-interval 3: iterations 3, 6 and the run's first iteration (training_log: `or is_first_iteration`).
    dense = run([*MODEL, "--train-iters", "7", "--log-interval", "3"], tmp_path)
    assert dense.rc == 0, dense.stderr[-2000:]
    lines = dense.iterations()
    assert sorted(lines) == [1, 3, 6]
    assert fields(lines[3].string) == [f for f in fields(real) if f != "load_balancing_loss"]
    assert "using world size: 1, data-parallel size: 1, context-parallel size: 1" in dense.stdout


def test_save_layout_and_tracker(reference: Out) -> None:
    m = re.search(r"saving checkpoint at iteration +4 to (\S+) in torch_dist format", reference.stdout)
    assert m, reference.stdout[-2000:]
    ckpt = Path(m[1])
    assert sorted(p.name for p in ckpt.iterdir()) == [
        "iter_0000004", "iter_0000008", "latest_checkpointed_iteration.txt",
    ]  # fmt: skip
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text() == "8"
    for it in (4, 8):
        d = ckpt / f"iter_{it:07d}"
        assert sorted(p.name for p in d.iterdir()) == [".metadata", "__0_0.distcp", "metadata.json"]
        assert json.loads((d / "metadata.json").read_text()) == {
            "sharded_backend": "torch_dist", "sharded_backend_version": 1,
        }  # fmt: skip
        saving = f"saving checkpoint at iteration {it:7d} to {ckpt} in torch_dist format"
        saved = f"successfully saved checkpoint from iteration {it:7d} to {ckpt} {RANKS}"
        assert re.search(rf"^\[[^]]+\] {re.escape(saving)}$", reference.stdout, re.M)
        assert re.search(rf"^  \[[^]]+\] {re.escape(saved)}$", reference.stdout, re.M)
    text = reference.stdout
    assert text.index("iteration        4/") < text.index("saving checkpoint at iteration       4")


def test_resume_continues_with_the_same_losses(reference: Out, tmp_path: Path) -> None:
    ck = str(tmp_path / "ckpt")
    flags = [*MODEL, "--num-experts", "4", "--train-iters", "8", "--save", ck, "--load", ck]
    flags += ["--save-interval", "4"]
    first = run([*flags, "--exit-interval", "4"], tmp_path)
    assert first.rc == 0, first.stderr[-2000:]
    tracker = f"{ck}/latest_checkpointed_iteration.txt"
    assert f"WARNING: could not find the metadata file {tracker}\n" in first.stdout
    assert "    will not load any checkpoints and will start from random\n" in first.stdout
    assert re.search(r"^\[exiting program at iteration 4\] datetime: \S+ \S+ $", first.stdout, re.M)
    assert sorted(first.iterations()) == [1, 2, 3, 4]

    resumed = run(flags, tmp_path)
    assert resumed.rc == 0, resumed.stderr[-2000:]
    assert f" loading distributed checkpoint from {ck} at iteration 4\n" in resumed.stdout
    assert f"  successfully loaded checkpoint from {ck} {RANKS} at iteration 4\n" in resumed.stdout
    ref, res = reference.iterations(), resumed.iterations()
    assert sorted(res) == [5, 6, 7, 8]
    for k in (5, 6, 7, 8):
        assert res[k]["consumed"] == ref[k]["consumed"]
        assert (res[k]["lr"], res[k]["norm"]) == (ref[k]["lr"], ref[k]["norm"]), k
    for k in (5, 7, 8):
        assert res[k]["loss"] == ref[k]["loss"], k
    # Megatron does not reset training_log's sums after a run's first iteration: the line of the second
    # iteration after a (re)start prints the mean loss of both.
    mean = (float(ref[5]["loss"]) + float(ref[6]["loss"])) / 2
    assert float(res[6]["loss"]) == pytest.approx(mean, rel=1e-6)


def test_sigterm_with_exit_signal_handler_saves_and_exits_0(tmp_path: Path) -> None:
    ck = tmp_path / "ckpt"
    args = [*MODEL, "--train-iters", "100000", "--save", str(ck), "--save-interval", "100000"]
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), *args, "--exit-signal-handler"], cwd=tmp_path,
        env=_env(FAKE_MEGATRON_STEP_SLEEP_S="0.05"), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True,
    )  # fmt: skip
    reader = Reader(proc)
    try:
        reader.wait_for(r"iteration +3/")
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=TIMEOUT_S)
    finally:
        proc.kill()
    out = Out(rc, reader.text(), "")
    assert rc == 0  # training.train: sys.exit(exit_code) with exit_code 0
    last = max(out.iterations())
    assert (ck / "latest_checkpointed_iteration.txt").read_text() == str(last)
    assert (ck / f"iter_{last:07d}" / "metadata.json").is_file()
    tail = out.stdout.split(f"iteration {last:8d}/", 1)[1].splitlines()[1:]
    saving = rf"\[\S+ \S+\] saving checkpoint at iteration {last:7d} to {ck} in torch_dist format"
    assert re.fullmatch(saving, tail[0])
    assert re.fullmatch(r"\[exiting program after receiving SIGTERM\.\] datetime: \S+ \S+ ", tail[-1])

    # Without --exit-signal-handler SIGTERM keeps its default action: the process dies, nothing saved.
    ck2 = tmp_path / "ckpt2"
    args = [*MODEL, "--train-iters", "100000", "--save", str(ck2), "--save-interval", "100000"]
    plain = subprocess.Popen(
        [sys.executable, str(SCRIPT), *args], cwd=tmp_path, env=_env(FAKE_MEGATRON_STEP_SLEEP_S="0.05"),
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    reader = Reader(plain)
    try:
        reader.wait_for(r"iteration +2/")
        plain.send_signal(signal.SIGTERM)
        assert plain.wait(timeout=TIMEOUT_S) == -signal.SIGTERM
    finally:
        plain.kill()
    assert not ck2.exists() and "saving checkpoint" not in reader.text()


def test_unknown_or_abbreviated_flag_is_argparses_error(tmp_path: Path) -> None:
    for bad in (["--no-such-flag"], ["--train-iter", "3"]):  # allow_abbrev=False, as Megatron's parser
        out = run([*MODEL, "--train-iters", "3", *bad], tmp_path)
        assert out.rc == 2
        assert f"pretrain_gpt.py: error: unrecognized arguments: {' '.join(bad)}\n" in out.stderr
        assert " iteration " not in out.stdout


def test_global_batch_not_divisible_fails_with_megatrons_message(tmp_path: Path) -> None:
    out = run([*MODEL, "--train-iters", "3", "--global-batch-size", "6", "--micro-batch-size", "4"], tmp_path)
    assert out.rc == 1
    msg = (
        "AssertionError: global batch size (6) is not divisible by micro batch size (4) times data "
        "parallel size (1)"
    )
    assert msg in out.stderr
    assert " iteration " not in out.stdout
    # A multiple of micro x dp is gradient accumulation, as in Megatron: 2 micro-batches per step.
    ok = run([*MODEL, "--train-iters", "1", "--global-batch-size", "8", "--micro-batch-size", "4"], tmp_path)
    assert ok.rc == 0 and "setting number of microbatches to constant 2" in ok.stderr
    assert ok.iterations()[1]["consumed"] == f"{8:12d}"


def _worker_pid(tag: str, rank: int) -> int:
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        mine = f"FAKE_MEGATRON_TEST_TAG={tag}".encode() in env and SCRIPT.name.encode() in cmd
        if mine and f"RANK={rank}".encode() in env:
            return int(pid)
    raise AssertionError(f"no rank {rank} worker")


@pytest.mark.slow
def test_two_ranks_under_torchrun_agree_on_sigterm_to_one(tmp_path: Path) -> None:
    """2 ranks over gloo: the iteration line from the last rank only, one shard file per rank, and a
    SIGTERM to rank 1 alone makes both ranks save and exit 0 (the flag is all-gathered)."""
    ck, tag = tmp_path / "ckpt", uuid.uuid4().hex
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd = [*torchrun, str(SCRIPT), *MODEL, "--train-iters", "100000", "--save", str(ck)]
    cmd += ["--save-interval", "3", "--exit-signal-handler"]
    env = _env(FAKE_MEGATRON_STEP_SLEEP_S="0.05", FAKE_MEGATRON_TEST_TAG=tag)
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    reader = Reader(proc)
    try:
        reader.wait_for(r"successfully saved checkpoint from iteration +3 ")
        reader.wait_for(r"iteration +4/")
        os.kill(_worker_pid(tag, 1), signal.SIGTERM)
        rc = proc.wait(timeout=TIMEOUT_S)
    finally:
        proc.kill()
    out = Out(rc, reader.text(), "")
    assert rc == 0
    assert "using world size: 2, data-parallel size: 2," in out.stdout
    its = out.iterations()  # raises if a line was printed by both ranks
    last = max(its)
    assert last >= 4 and sorted(its) == list(range(1, last + 1))
    assert its[1]["consumed"] == f"{4:12d}"
    assert (ck / "latest_checkpointed_iteration.txt").read_text() == str(last)
    for it in {3, last}:
        d = ck / f"iter_{it:07d}"
        names = sorted(p.name for p in d.iterdir())
        assert names == [".metadata", "__0_0.distcp", "__1_0.distcp", "metadata.json"]
    assert out.stdout.count("[exiting program after receiving SIGTERM.] datetime:") == 1
    assert out.stdout.count(f"successfully saved checkpoint from iteration {last:7d}") == 1
