"""The writers' shared loop parts: signals, the output check, a write that never raises.

Monitoring must never fail or hold up a training job or the controller: an output directory that is
missing or not writable is one line on stderr and exit 0; a write that fails later is one line (until a
write succeeds again) and the loop goes on; SIGTERM/SIGINT end the loop at the next check (at most
`TICK_S` later) and the caller writes its last file. SIGUSR1 is ignored: Slurm's `--signal=USR1@...`
(no `B:`) signals every process of the job step, this one too, and its default action is to exit.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from .exposition import write_atomic

TICK_S = 0.1  # how often a sleeping loop looks at the stop flag


@dataclass
class Stopper:
    """Set by SIGTERM/SIGINT; `sleep` returns early once set."""

    signum: int | None = None

    def install(self) -> Stopper:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        return self

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self.signum = signum

    @property
    def stopped(self) -> bool:
        return self.signum is not None

    def sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.stopped:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(TICK_S, left))


def output_problem(out: Path) -> str | None:
    """Why `out` cannot be written (its directory missing or not writable), or None."""
    d = out.parent
    if not d.is_dir():
        return f"{d} does not exist (is node_exporter's textfile collector set up on this host?)"
    if not os.access(d, os.W_OK | os.X_OK):
        return f"{d} is not writable by uid {os.getuid()} (is the user in the textfile group?)"
    if out.is_dir():
        return f"{out} is a directory"
    return None


@dataclass
class Publisher:
    """Writes the file; reports the first failure of a run of failures, once, on stderr."""

    out: Path
    prog: str
    failing: bool = False
    writes: int = 0

    def publish(self, text: str) -> bool:
        try:
            write_atomic(self.out, text)
        except OSError as e:
            if not self.failing:
                print(f"{self.prog}: cannot write {self.out}: {e} (will retry)", file=sys.stderr, flush=True)
            self.failing = True
            return False
        if self.failing:
            print(f"{self.prog}: writing {self.out} again", file=sys.stderr, flush=True)
        self.failing = False
        self.writes += 1
        return True


def sweep_stale(out: Path, prefix: str, retain_s: float, now: float | None = None) -> list[Path]:
    """Remove the other writers' files in `out`'s directory (`<prefix>*.prom`, and the
    `<prefix>*.prom.<pid>.tmp` of a writer killed mid-write) whose last write is older than `retain_s`:
    a running writer rewrites its file every interval, so only finished (or dead) jobs' files qualify.
    `out` itself is never touched. Never raises (another writer may be sweeping the same directory)."""
    now = time.time() if now is None else now
    removed = []
    try:
        entries = list(out.parent.iterdir())
    except OSError:
        return removed
    for p in entries:
        name = p.name
        if p == out or not name.startswith(prefix):
            continue
        if not (name.endswith(".prom") or (".prom." in name and name.endswith(".tmp"))):
            continue
        try:
            if now - p.lstat().st_mtime <= retain_s or not p.is_file():
                continue
            p.unlink()
        except OSError:
            continue
        removed.append(p)
    return removed
