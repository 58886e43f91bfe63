"""Process helpers: tie the trainer's helper processes to the trainer's lifetime and keep them out of
the batch system's preemption signals.

Helpers a trainer starts: dist_checkpointing's 'spawn' multiprocessing Manager (the results queue of
every save) and the multiprocessing resource_tracker that a spawn-context start brings up.

Slurm's `--signal=USR1@s` / `scancel --signal` signal every process of the step: a helper left at the
default action would die on SIGUSR1/SIGTERM in the middle of the checkpoint that signal asks for.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from collections.abc import Iterator

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
    survives the preemption signals; start the resource_tracker immune to them too.

    dist_checkpointing creates `mp.get_context("spawn").Manager().Queue()` at the first save and never
    stops it; a SIGKILLed trainer would leave that Manager (and the resource_tracker it keeps alive)
    orphaned, holding the launcher's stdout open. The pre-created Manager's initializer sets
    PR_SET_PDEATHSIG and ignores SIGUSR1/SIGTERM; on a normal exit it is shut down by its finalizer.
    The resource_tracker exits by itself once every holder of its pipe is gone.
    """
    global _manager
    import multiprocessing as mp
    from multiprocessing import resource_tracker
    from multiprocessing.managers import SyncManager

    from megatron.core.dist_checkpointing.strategies import filesystem_async

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
    filesystem_async._results_queue = mgr.Queue()
