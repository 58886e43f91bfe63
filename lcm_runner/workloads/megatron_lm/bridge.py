"""One rank of a user's Megatron-LM job: run their script unchanged, turn its console lines into the
project's telemetry, pass signals on the way Megatron-LM expects them, and exit with the code the batch
script understands.

    python -m lcm_runner.workloads.megatron_lm.bridge --telemetry-dir DIR --seq-length S \\
        [--exit-signal SIGTERM] -- PYTHON SCRIPT ARGS...

The agent starts this module as each rank (forked from its zygote, which preloads nothing heavy for it:
the bridge imports no torch). The bridge starts the user's command as its child with the rank's
environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT: torchrun's), copies every line of the
child's output to its own stdout (the rank log) unchanged, and feeds it to the Megatron-LM log parser
(logparse.py): an iteration line becomes a `step` record, the save and load lines `ckpt_begin` /
`ckpt_end` / `resume` records. Record times are when the line reached the bridge (the printed timestamp
is kept as `printed_ts`). Lines that look like Megatron's records but do not parse are counted and
sampled in a `log_parse` record at exit, never dropped silently.

Signals: SIGTERM, SIGINT, SIGUSR1 and SIGUSR2 reaching the bridge (the agent forwards scancel's and
the time-limit warning's) are recorded and sent to the child as its exit signal (Megatron's
`--exit-signal`, SIGTERM by default), which `--exit-signal-handler` turns into a checkpoint at the end
of the iteration. Megatron-LM then exits 0 after printing "exiting program after receiving SIGTERM.";
the bridge exits ExitCode.REQUEUE (75) for that, so the batch script requeues and the next start loads
the checkpoint. A SIGKILL of the bridge takes the child with it (PR_SET_PDEATHSIG) and both share the
rank's process group.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from lcm_runner.contracts import (
    EVENT_CKPT_BEGIN,
    EVENT_CKPT_END,
    EVENT_EXIT,
    EVENT_LOG_PARSE,
    EVENT_RESUME,
    EVENT_SIGNAL,
    EVENT_START,
    EVENT_STEP,
    ExitCode,
)
from lcm_runner.train.procutil import root_mount
from lcm_runner.train.telemetry import TelemetryWriter, attempt_from_env, job_from_env

from . import logparse

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)
_PR_SET_PDEATHSIG = 1
MALFORMED_SAMPLES = 20


def _die_with_parent() -> None:  # runs in the child between fork and exec
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class Bridge:
    def __init__(self, tel: TelemetryWriter, seq_length: int, exit_signal: int) -> None:
        self.tel = tel
        self.seq_length = seq_length
        self.exit_signal = exit_signal
        self.parser = logparse.MegatronLogParser()
        self.child: subprocess.Popen[bytes] | None = None
        self.signals: list[str] = []
        self.exit_requested: str | None = None  # reason of Megatron's own exit message, when seen
        self.last_iteration: int | None = None
        self._save_begin: dict[int, float] = {}  # iteration -> ts of its "saving checkpoint" line
        self._load_begin: float | None = None
        # open saves whose iterations went on (async): the blocking part ended when the next began
        self._blocking: dict[int, float] = {}

    # ------------------------------------------------------------------------- signals

    def on_signal(self, signum: int, _frame: Any) -> None:
        name = signal.Signals(signum).name
        self.signals.append(name)
        self.tel.emit_from_signal_handler(
            EVENT_SIGNAL, name=name, forwarded=signal.Signals(self.exit_signal).name
        )
        if self.child is not None and self.child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.child.send_signal(self.exit_signal)

    # ------------------------------------------------------------------------- lines -> records

    def handle(self, line: str, now: float) -> None:
        for ev in self.parser.feed(line):
            self.record(ev, now)

    def record(self, ev: logparse.Event, now: float) -> None:
        printed = getattr(ev, "ts", None)
        extra = {"printed_ts": printed} if printed is not None else {}
        if isinstance(ev, logparse.Iteration):
            for it, begin in self._save_begin.items():
                # an async save: training went on; its blocking part ended when this iteration began
                self._blocking.setdefault(it, max(0.0, now - ev.step_time_s - begin))
            self.last_iteration = ev.iteration
            gbs = ev.global_batch_size
            self.tel.emit(
                EVENT_STEP,
                step=ev.iteration,
                loss=ev.loss,
                step_time_s=ev.step_time_s,
                tokens_per_s=(gbs * self.seq_length / ev.step_time_s) if gbs and ev.step_time_s else None,
                grad_norm=ev.grad_norm,
                learning_rate=ev.learning_rate,
                loss_scale=ev.loss_scale,
                skipped_iterations=ev.skipped_iterations,
                nan_iterations=ev.nan_iterations,
                losses=ev.losses,
                **extra,
            )
        elif isinstance(ev, logparse.CkptSaveBegin):
            self._save_begin[ev.iteration] = now
            self.tel.emit(EVENT_CKPT_BEGIN, step=ev.iteration, path=ev.path, format=ev.fmt, **extra)
        elif isinstance(ev, logparse.CkptSaveEnd):
            begin = self._save_begin.pop(ev.iteration, None)
            blocking = self._blocking.pop(ev.iteration, None)
            total = now - begin if begin is not None else None
            self.tel.emit(
                EVENT_CKPT_END,
                durable=True,
                step=ev.iteration,
                blocking_s=total if blocking is None else blocking,
                total_s=total,
                bytes=_dir_bytes(Path(ev.path)) if ev.path else None,
                path=ev.path,
                **extra,
            )
        elif isinstance(ev, logparse.CkptLoadBegin):
            self._load_begin = now
        elif isinstance(ev, logparse.CkptLoadEnd):
            load_s = now - self._load_begin if self._load_begin is not None else None
            self.tel.emit(EVENT_RESUME, durable=True, step=ev.iteration, load_s=load_s, path=ev.path, **extra)
        elif isinstance(ev, logparse.ExitRequested):
            self.exit_requested = ev.reason

    # ------------------------------------------------------------------------- run

    def run(self, argv: list[str]) -> int:
        for s in FORWARDED:
            signal.signal(s, self.on_signal)
        try:
            self.child = subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )
        except OSError as exc:
            self.tel.emit(
                EVENT_EXIT, durable=True, code=int(ExitCode.BAD_ARGS), reason=f"cannot start: {exc}"
            )
            print(f"bridge: cannot start {argv[:2]}: {exc}", file=sys.stderr, flush=True)
            return int(ExitCode.BAD_ARGS)
        assert self.child.stdout is not None
        out = sys.stdout.buffer
        for raw in iter(self.child.stdout.readline, b""):
            now = time.time()
            out.write(raw)
            out.flush()
            self.handle(raw.decode("utf-8", "replace"), now)
        code = self.child.wait()
        return self.finish(code)

    def finish(self, child_code: int) -> int:
        st = self.parser.stats
        self.tel.emit(
            EVENT_LOG_PARSE,
            durable=True,
            lines=st.lines,
            events=st.events,
            malformed=st.malformed,
            malformed_lines=[
                f"{m.lineno}: {m.text[:300]} ({m.reason})" for m in st.malformed_lines[:MALFORMED_SAMPLES]
            ],
        )
        if st.malformed:
            print(
                f"bridge: {st.malformed} Megatron-LM log line(s) did not parse (first: "
                f"{st.malformed_lines[0].lineno}: {st.malformed_lines[0].text[:200]!r})",
                file=sys.stderr,
                flush=True,
            )
        code, reason = exit_code(child_code, self.exit_requested, self.signals)
        self.tel.emit(EVENT_EXIT, durable=True, code=code, reason=reason, child_code=child_code)
        return code


def exit_code(child_code: int, exit_requested: str | None, signals: list[str]) -> tuple[int, str]:
    """The rank's exit code for the agent and the batch script, from the child's."""
    if child_code == 0 and exit_requested == "signal":
        return int(ExitCode.REQUEUE), "Megatron-LM saved and exited after the exit signal: requeue"
    if child_code == 0:
        return int(
            ExitCode.OK
        ), "finished" if exit_requested is None else f"Megatron-LM exit ({exit_requested})"
    if child_code < 0:
        return int(ExitCode.FAILURE), f"killed by {signal.Signals(-child_code).name}"
    if child_code == 2:
        return int(ExitCode.BAD_ARGS), "Megatron-LM refused its arguments (exit 2)"
    if signals and child_code != 0:
        return int(ExitCode.FAILURE), f"exit {child_code} after {', '.join(signals)}"
    return int(ExitCode.FAILURE), f"Megatron-LM exited {child_code}"


def _dir_bytes(path: Path) -> int | None:
    """Size of a checkpoint's files (Megatron prints the save root; the newest iter dir is the save)."""
    try:
        dirs = sorted(d for d in path.glob("iter_*") if d.is_dir())
        if not dirs:
            return None
        return sum(f.stat().st_size for f in dirs[-1].rglob("*") if f.is_file())
    except OSError:
        return None


def _start_fields(seq_length: int) -> dict[str, Any]:
    env = os.environ
    local = int(env.get("LOCAL_RANK", "0"))
    visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "local_rank": local,
        "world_size": int(env.get("WORLD_SIZE", "1")),
        "gpu": visible[local] if local < len(visible) else None,
        "workload": "megatron-lm",
        "seq_length": seq_length,
        "rootfs": root_mount(),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m lcm_runner.workloads.megatron_lm.bridge", description=__doc__
    )
    ap.add_argument("--telemetry-dir", required=True, type=Path)
    ap.add_argument("--seq-length", required=True, type=int)
    ap.add_argument(
        "--exit-signal", default="SIGTERM", help="the child's exit signal (Megatron's --exit-signal)"
    )
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- PYTHON SCRIPT ARGS...")
    ns = ap.parse_args(argv)
    command = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
    if not command:
        ap.error("no command after --")
    try:
        sig = signal.Signals[ns.exit_signal]
    except KeyError:
        ap.error(f"--exit-signal {ns.exit_signal!r} is not a signal name")
    tel = TelemetryWriter(
        ns.telemetry_dir, int(os.environ.get("RANK", "0")), attempt_from_env(), job_from_env()
    )
    tel.emit(EVENT_START, **_start_fields(ns.seq_length), command=command[:2])
    try:
        return Bridge(tel, ns.seq_length, int(sig)).run(command)
    finally:
        tel.close()


if __name__ == "__main__":
    raise SystemExit(main())
