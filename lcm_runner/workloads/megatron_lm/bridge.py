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
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from lcm_runner.contracts import (
    EVENT_CKPT_END,
    EVENT_EXIT,
    EVENT_LOG_PARSE,
    EVENT_RESUME,
    EVENT_SIGNAL,
    EVENT_START,
    ExitCode,
)
from lcm_runner.train.procutil import root_mount
from lcm_runner.train.telemetry import TelemetryWriter, attempt_from_env, job_from_env

from . import logparse, logrecords

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
        # the same mapping as an offline parse (logrecords.to_telemetry), with the bridge's own stamps
        self.mapper = logrecords.TelemetryMapper(seq_length, lambda ts, event: {"ts": ts, "event": event})
        self.child: subprocess.Popen[bytes] | None = None
        self.signals: list[str] = []
        self.exit_requested: str | None = None  # reason of Megatron's own exit message, when seen
        self.last_iteration: int | None = None

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
        """One event -> its telemetry record, stamped when the line reached the bridge (the printed
        time, where the line has one, kept as `printed_ts`)."""
        if isinstance(ev, logparse.ExitRequested):
            self.exit_requested = ev.reason
        if isinstance(ev, logparse.Iteration):
            self.last_iteration = ev.iteration
        printed = ev.ts
        rec = self.mapper.map(dataclasses.replace(ev, ts=now))
        if rec is None:
            return
        event = rec.pop("event")
        if printed is not None:
            rec["printed_ts"] = printed
        if event == EVENT_CKPT_END and rec.get("path"):
            rec["bytes"] = _dir_bytes(Path(rec["path"]), int(rec["step"]))
        self.tel.emit(event, durable=event in (EVENT_CKPT_END, EVENT_RESUME), **rec)

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
    if exit_requested == "signal":
        # its "exiting program after receiving SIGTERM." line comes after the save: the checkpoint is
        # whole; a crash while the interpreter tears down (NCCL/gloo threads) does not undo it
        how = f"{signal.Signals(-child_code).name}" if child_code < 0 else f"exit {child_code}"
        return int(
            ExitCode.REQUEUE
        ), f"Megatron-LM saved after the exit signal, then died at exit ({how}): requeue"
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


def _dir_bytes(path: Path, iteration: int) -> int | None:
    """Size of the files of the checkpoint of `iteration` (Megatron prints the save root)."""
    d = path / f"iter_{iteration:07d}"
    try:
        return sum(f.stat().st_size for f in d.rglob("*") if f.is_file()) if d.is_dir() else None
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
