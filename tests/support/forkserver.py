"""Trainer ranks for the tests started as forks of one warm process instead of new interpreters.

A new `python -m lcm_runner.train` spends 4-5 s of CPU importing torch and megatron-core before its first
line, and the multi-process CPU tests start about a hundred of them per CI run on 2 cores. The project's
agent solves the same problem in production with a zygote (lcm_runner.launch.zygote); this is that zygote
for the tests: one server process per pytest session imports what a rank needs (zygote.preload), then
forks each requested rank, which runs the module as __main__ (zygote.run_module: the agent's own code)
with the request's environment, working directory and output file. The server is started lazily, by the
first request, with the environment trainruns._env gives every rank.

What a forked rank differs in, and how the tests still see what they check:
- /proc/<pid>/environ and cmdline are the server's (the kernel keeps the exec-time copies; changing them
  needs CAP_SYS_RESOURCE). Every rank leads its own session (setsid), and trainruns' leftover check also
  counts every process of the sessions started for a tag (`sessions(tag)`).
- Settings read at import time come from the server's environment. A request whose PYTHONPATH differs
  from the server's (an overlay such as NVRx for the in-process tests) is started by exec, as before.
- Exit codes are reported by the server (it is the ranks' parent): `Rank.wait` / `poll` give what
  Popen.wait would (a negative signal number for a killed rank).
LCM_TEST_FORKSERVER=0 starts every rank by exec.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
MODULE = "lcm_runner.train"


def enabled() -> bool:
    return os.environ.get("LCM_TEST_FORKSERVER", "1") != "0"


class Rank:
    """A forked rank, with the part of Popen's interface the tests use."""

    def __init__(self, server: Server, pid: int) -> None:
        self._server = server
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._server.cond:
            while self.poll() is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(f"rank pid {self.pid}", timeout or 0)
                self._server.cond.wait(timeout=0.5 if left is None else min(left, 0.5))
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class Server:
    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.proc = subprocess.Popen(
            [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
             "import forkserver; forkserver.serve()"],
            cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None,
        )  # fmt: skip
        self.cond = threading.Condition()
        self._exits: dict[int, int] = {}
        self._replies: dict[int, dict[str, Any]] = {}
        self._next = 0
        self._sessions: dict[str, set[int]] = {}
        self._lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            msg = json.loads(line)
            with self.cond:
                if "exit" in msg:
                    self._exits[int(msg["exit"])] = int(msg["code"])
                else:
                    self._replies[int(msg["id"])] = msg
                self.cond.notify_all()
        with self.cond:  # the server is gone: its ranks died with it (PR_SET_PDEATHSIG)
            self._exits.setdefault(-1, -9)
            self.cond.notify_all()

    def exit_code(self, pid: int) -> int | None:
        with self.cond:
            if pid in self._exits:
                return self._exits[pid]
            return -9 if -1 in self._exits else None

    def spawn(self, args: list[str], env: dict[str, str], cwd: Path, log: Path, tag: str) -> Rank:
        with self._lock:
            self._next += 1
            rid = self._next
            req = {"id": rid, "args": args, "env": env, "cwd": str(cwd), "log": str(log)}
            assert self.proc.stdin is not None
            self.proc.stdin.write((json.dumps(req) + "\n").encode())
            self.proc.stdin.flush()
        with self.cond:
            deadline = time.monotonic() + 120  # the first request waits for the server's imports
            while rid not in self._replies:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"the test fork server did not start a rank (exit {self.proc.poll()})")
                self.cond.wait(timeout=0.5)
            msg = self._replies.pop(rid)
        if "error" in msg:
            raise RuntimeError(f"the test fork server: {msg['error']}")
        pid = int(msg["pid"])
        self._sessions.setdefault(tag, set()).add(pid)
        return Rank(self, pid)

    def sessions(self, tag: str) -> set[int]:
        return set(self._sessions.get(tag, ()))


_server: Server | None = None
_server_lock = threading.Lock()


def server(env: dict[str, str]) -> Server:
    global _server
    with _server_lock:
        if _server is None or _server.proc.poll() is not None:
            _server = Server(env)
        return _server


def start(
    argv: list[str], env: dict[str, str], cwd: Path, log: Path, tag: str, base_env: dict[str, str]
) -> Rank | subprocess.Popen[bytes]:
    """Start `python -m lcm_runner.train ARGS` (argv as given to Popen) with `env`, its output appended to
    `log`: forked from the server when possible, else exec'd. `base_env` starts the server."""
    forkable = (
        enabled()
        and argv[1:3] == ["-m", MODULE]
        and env.get("PYTHONPATH", "") == base_env.get("PYTHONPATH", "")
    )
    if forkable:
        try:
            return server(base_env).spawn(argv[3:], env, cwd, log, tag)
        except RuntimeError as e:
            print(f"forkserver: {e}; starting the rank by exec", file=sys.stderr)
    out = open(log, "ab")  # noqa: SIM115 - handed to the child
    try:
        return subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    finally:
        out.close()


def sessions(tag: str) -> set[int]:
    return _server.sessions(tag) if _server is not None else set()


# ---------------------------------------------------------------------------------------- the server


def _child(req: dict[str, Any]) -> None:
    from lcm_runner.launch import zygote

    try:
        os.setsid()
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: die with the server
        for s in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(s, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.chdir(req["cwd"])
        os.environ.clear()
    except BaseException as e:  # report and leave
        os.write(2, f"forkserver child: {e!r}\n".encode())
        os._exit(1)
    zygote.run_module(MODULE, list(req["args"]), dict(req["env"]), Path(req["log"]))


def serve() -> None:
    """The server's loop: preload, then fork a rank per request line; report each exit."""
    from lcm_runner.launch import zygote

    zygote.preload(MODULE, [])
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # what the imports or a child would print goes to stderr, not into the protocol
    children: set[int] = set()
    buf = b""
    stdin = sys.stdin.fileno()
    eof = False
    while not eof or children:
        ready, _, _ = select.select([] if eof else [stdin], [], [], 0.02)
        if ready:
            chunk = os.read(stdin, 65536)
            if not chunk:
                eof = True  # pytest is done: the running ranks finish, then the server goes
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                req = json.loads(line)
                try:
                    pid = os.fork()
                except OSError as e:
                    out.write(json.dumps({"id": req["id"], "error": repr(e)}) + "\n")
                    continue
                if pid == 0:
                    out.close()
                    _child(req)
                children.add(pid)
                out.write(json.dumps({"id": req["id"], "pid": pid}) + "\n")
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                children.clear()
                break
            if pid == 0:
                break
            if pid in children:
                children.discard(pid)
                out.write(json.dumps({"exit": pid, "code": os.waitstatus_to_exitcode(status)}) + "\n")
