"""Process helpers: tie the trainer's helper processes to the trainer's lifetime and keep them out of
the batch system's preemption signals.

Helpers a trainer starts: dist_checkpointing's 'spawn' multiprocessing Manager (the results queue of
every save), the multiprocessing resource_tracker that a spawn-context start brings up, and the forked
writer of each asynchronous save. Two launch paths must leave none of them behind:

- our forking agent (lcm_runner.launch.agent): its teardown also kills whatever the node's tag shows;
- stock torchrun / `python -m lcm_runner.train`: nothing cleans up after a SIGKILLed rank. A spawned
  child does not re-run a package's `__main__`, so nothing placed there runs in the helpers; what
  runs is set up here, at the first CheckpointManager, in the trainer itself.

Slurm's `--signal=USR1@s` / `scancel --signal` signal every process of the step: a helper left at the
default action would die on SIGUSR1/SIGTERM in the middle of the checkpoint that signal asks for.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

_PR_SET_PDEATHSIG = 1

# the batch system's preemption signals: the trainer handles them (checkpoint, exit 75); its helpers
# must survive them and end with the trainer instead
HELPER_IGNORED = (signal.SIGUSR1, signal.SIGTERM)


def die_with_parent(sig: int = signal.SIGKILL, parent: int | None = None) -> bool:
    """prctl(PR_SET_PDEATHSIG): the kernel sends `sig` to this process when its parent exits (Linux).

    `parent`: the pid that started this process; when the parent is already gone before the prctl took
    effect (re-parented to init or to a subreaper), `sig` is sent at once. Without it only a parent of 1
    counts as gone."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    ppid = os.getppid()
    if (parent is not None and ppid != parent) or ppid == 1:
        os.kill(os.getpid(), sig)
    return True


def helper_init(parent: int) -> None:
    """Initializer of a spawned helper (the checkpoint Manager): ignore the preemption signals, die
    with the trainer `parent`."""
    for sig in HELPER_IGNORED:
        signal.signal(sig, signal.SIG_IGN)
    die_with_parent(parent=parent)


class PickledQueue:
    """A Manager queue that carries each item as pickled bytes: the Manager process stores bytes and
    never unpickles a save's write results (torch.distributed.checkpoint's WriteResult), so it never
    imports torch. It did at the first put: a 2-rank CPU run's first save took 2.13 s, 2.1 s of it
    waiting on that import, the next ones 0.09 s (the lab's stage jobs: 3.6-4.4 s vs 0.1-0.4 s), and
    every trainer's Manager spent the CPU of a torch import. The two calls dist_checkpointing makes
    (FileSystemWriterAsync: put in the writer, get_nowait in the trainer), plus get."""

    def __init__(self, proxy: Any) -> None:
        self._q = proxy

    def put(self, item: Any, *args: Any, **kwargs: Any) -> None:
        self._q.put(pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL), *args, **kwargs)

    def get(self, *args: Any, **kwargs: Any) -> Any:
        return pickle.loads(self._q.get(*args, **kwargs))

    def get_nowait(self) -> Any:
        return pickle.loads(self._q.get_nowait())


_fork_state = {"registered": False, "parent": 0, "main": False}


def _before_fork() -> None:
    _fork_state["parent"] = os.getpid()
    _fork_state["main"] = threading.current_thread() is threading.main_thread()


def _after_fork_child() -> None:
    # PDEATHSIG fires when the forking *thread* exits: only a fork from the main thread (what
    # multiprocessing's fork context and the async checkpoint writer do) is tied, a worker thread's
    # short life must not kill what it forked
    if _fork_state["main"]:
        die_with_parent(parent=_fork_state["parent"])


def forked_children_die_with_this_process() -> None:
    """Every child this process forks from its main thread from now on (the asynchronous checkpoint
    writers of megatron's AsyncCallsQueue, any fork-context multiprocessing helper) gets SIGKILL
    when this process dies. Idempotent. subprocess's fork+exec does not run these hooks."""
    if _fork_state["registered"]:
        return
    _fork_state["registered"] = True
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_child)


@contextlib.contextmanager
def preemption_signals_blocked() -> Iterator[None]:
    """Block SIGUSR1/SIGTERM in this thread while helpers are started: a blocked mask is inherited
    through fork and exec, so a helper is born immune (until its own initializer ignores them; the
    resource_tracker keeps SIGUSR1 blocked and ignores SIGTERM itself). Nothing is lost in the trainer:
    its other threads still take a process-directed signal, and one pending here is delivered when
    the mask is restored."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, HELPER_IGNORED)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


_manager: object | None = None


def install_checkpoint_results_queue() -> None:
    """Give dist_checkpointing a results queue whose Manager process dies with this trainer and
    survives the preemption signals; start the resource_tracker immune to them too; tie forked
    checkpoint writers to this process.

    dist_checkpointing creates `mp.get_context("spawn").Manager().Queue()` at the first save and never
    stops it; a SIGKILLed trainer would leave that Manager (and the resource_tracker it keeps alive)
    orphaned, holding the launcher's stdout open. The pre-created Manager's initializer sets
    PR_SET_PDEATHSIG and ignores SIGUSR1/SIGTERM; on a normal exit it is shut down by its finalizer.
    The resource_tracker exits by itself once every holder of its pipe (this process, the Manager,
    forked writers) is gone.
    """
    global _manager
    import multiprocessing as mp
    from multiprocessing import resource_tracker
    from multiprocessing.managers import SyncManager

    from megatron.core.dist_checkpointing.strategies import filesystem_async

    forked_children_die_with_this_process()
    if getattr(filesystem_async, "_results_queue", None) is not None:
        return
    mgr = SyncManager(ctx=mp.get_context("spawn"))
    with preemption_signals_blocked():
        # the spawn below would start the tracker; ensure_running() unblocks SIGTERM on its way out
        # (its own INT/TERM dance), so block again before the Manager is spawned
        resource_tracker.ensure_running()
    with preemption_signals_blocked():
        mgr.start(initializer=helper_init, initargs=(os.getpid(),))
    _manager = mgr
    filesystem_async._results_queue = PickledQueue(mgr.Queue())


def root_mount(mountinfo: str = "/proc/self/mountinfo") -> str:
    """What this process's `/` is, from mountinfo: the mount's root field, plus ` upper=<upperdir>` when
    it is an overlay. On a plain node "/" (a podman node: "/ upper=<podman's layer>"); inside an Enroot
    container (Pyxis) it names Enroot's paths: "<ENROOT_DATA_PATH>/pyxis_<job>_<step>" for an unpacked
    image, "/ upper=<ENROOT_RUNTIME_PATH>/overlay/upper" for one started from the squashfs (squashfuse).
    The start event records it, so a run shows whether its ranks ran in a container. "" if unreadable."""
    try:
        with open(mountinfo, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return ""
    out = ""
    for line in lines:
        head, sep, tail = line.partition(" - ")
        fields = head.split()
        if not sep or len(fields) < 5 or fields[4] != "/":
            continue
        out = fields[3]  # the last mount on / is the one in effect
        rest = tail.split()
        if rest and rest[0] == "overlay" and len(rest) > 2:
            upper = [o for o in rest[2].split(",") if o.startswith("upperdir=")]
            if upper:
                out += " upper=" + upper[0].removeprefix("upperdir=")
    return out


def in_enroot_container(rootfs: str) -> bool:
    """Whether a root_mount() value is an Enroot container's (Enroot's data or runtime paths)."""
    return "/pyxis_" in rootfs or "/enroot/" in rootfs
