"""Multi-process CPU runs of the trainer for the tests (tests/unit, tests/faults): two ranks started
directly (env:// rendezvous as torchrun would set it) or under stock torchrun, a tag in every process's
environment to find leftovers, and the run's telemetry. Ranks started directly are forks of a warm
process (forkserver.py: the agent's zygote for the tests) unless LCM_TEST_FORKSERVER=0."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import forkserver

from lcm_runner.telemetry import load_run, steps

REPO = Path(__file__).resolve().parents[2]
ITERS = 8
MODEL = [
    "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--ffn-hidden-size", "64",
    "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "8", "--vocab-size", "64",
    "--num-experts", "4", "--moe-router-topk", "2", "--expert-model-parallel-size", "2",
    "--lr", "3e-3", "--seed", "1234", "--device", "cpu",
]  # fmt: skip
TIMEOUT_S = 240


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(tag: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS="1",
        PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
        TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
        LCM_TEST_TAG=tag,  # every process of this run inherits it: used to find orphans
        PYTHONWARNINGS="ignore",
    )
    env.pop("LCM_RUN_DIR", None)
    return env


_RUN_KEYS = ("LCM_TEST_TAG", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _server_env() -> dict[str, str]:
    """The fork server's own environment: every rank's, without anything of one run."""
    env = _env("")
    for k in _RUN_KEYS:
        env.pop(k, None)
    return env


def start_rank(args: list[str], env: dict[str, str], log: Path, tag: str):
    """`python -m lcm_runner.train ARGS` with `env`, its output appended to `log`; a Popen-like handle."""
    return forkserver.start(
        [sys.executable, "-m", "lcm_runner.train", *args], env, REPO, log, tag, _server_env()
    )


def run_one(
    run_dir: Path, args: list[str], env: dict[str, str], timeout: float = TIMEOUT_S
) -> tuple[int, str]:
    """One process of the trainer (no torchrun environment), run to its end: (exit code, its output)."""
    env = {k: v for k, v in env.items() if k not in _RUN_KEYS[1:]}
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir / f"process-{uuid.uuid4().hex[:8]}.log"
    p = start_rank(args, env, log, env.get("LCM_TEST_TAG", ""))
    try:
        code = p.wait(timeout=timeout)
    finally:
        if p.poll() is None:
            p.kill()
    return code, log.read_text(errors="replace")


@dataclass
class Run:
    dir: Path
    codes: list[int]
    tag: str
    log: str

    @property
    def ckpt(self) -> Path:
        return self.dir / "ckpt"

    def records(self) -> list:
        return load_run(self.dir)

    def losses(self, attempt: int | None = None) -> dict[int, str]:
        """step -> loss hex on rank 0 (the DP-averaged loss is the same on every rank)."""
        return {
            r.step: r.get("loss_hex")
            for r in steps(self.records(), rank=0)
            if attempt is None or r.attempt == attempt
        }


def _leftovers(tag: str) -> list[str]:
    """The live processes of a run: its tag in their environment, or (ranks forked by the fork server,
    whose /proc environ is the server's) in a session one of its ranks leads."""
    found = []
    sids = forkserver.sessions(tag)
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
            stat = Path(f"/proc/{pid}/stat").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2 :].split()
        if fields[0] == b"Z":  # a zombie holds nothing (its parent reaps it)
            continue
        if f"LCM_TEST_TAG={tag}".encode() in env or int(fields[3]) in sids:
            found.append(f"{pid}: {cmd}")
    return found


def _wait_for_no_leftovers(tag: str, within_s: float = 10.0) -> list[str]:
    deadline = time.time() + within_s
    while (left := _leftovers(tag)) and time.time() < deadline:
        time.sleep(0.2)
    return left


def run_direct(
    run_dir: Path,
    extra: list[str],
    on_start=None,
    env_extra: dict[str, str] | None = None,
    model=None,
    nproc: int = 2,
    save: bool = True,
) -> Run:
    """`nproc` ranks (default 2) started directly (env:// rendezvous as torchrun would set it);
    `env_extra` e.g. TORCHELASTIC_RESTART_COUNT to stand for a restart; `save=False`: no --save of
    <run_dir>/ckpt (the caller passes its own --save/--load)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex
    env = _env(tag)
    env.update(
        WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), **(env_extra or {})
    )
    args = [
        *(MODEL if model is None else model),
        *(["--save", str(run_dir / "ckpt")] if save else []),
        "--telemetry-dir",
        str(run_dir / "telemetry"),
        *extra,
    ]
    procs = []
    for rank in range(nproc):
        e = dict(env, RANK=str(rank), LOCAL_RANK=str(rank))
        procs.append(start_rank(args, e, run_dir / f"rank{rank}.log", tag))
    try:
        if on_start is not None:
            on_start(procs, run_dir)
        codes = [p.wait(timeout=TIMEOUT_S) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    text = "\n".join((run_dir / f"rank{r}.log").read_text(errors="replace")[-3000:] for r in range(nproc))
    return Run(run_dir, codes, tag, text)


def run_torchrun(run_dir: Path, extra: list[str], max_restarts: int) -> Run:
    run_dir.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
        "--max-restarts", str(max_restarts),
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{_free_port()}", "--monitor-interval", "0.5",
        "-m", "lcm_runner.train", *MODEL, "--save", str(run_dir / "ckpt"),
        "--telemetry-dir", str(run_dir / "telemetry"), *extra,
    ]  # fmt: skip
    with open(run_dir / "torchrun.log", "wb") as log:
        p = subprocess.run(
            cmd, cwd=REPO, env=_env(tag), stdout=log, stderr=log, timeout=TIMEOUT_S, check=False
        )
    return Run(run_dir, [p.returncode], tag, (run_dir / "torchrun.log").read_text(errors="replace")[-4000:])
