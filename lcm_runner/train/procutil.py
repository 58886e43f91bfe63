"""Process helpers: tie helper processes' lifetime to the trainer's."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """prctl(PR_SET_PDEATHSIG): the kernel sends `sig` to this process when its parent exits (Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    # the parent may already be gone (re-parented to init/subreaper) before prctl took effect
    if os.getppid() == 1:
        os.kill(os.getpid(), sig)
    return True


_manager: object | None = None


def install_checkpoint_results_queue() -> None:
    """Give dist_checkpointing a results queue whose Manager process dies with this trainer.

    dist_checkpointing creates `mp.get_context("spawn").Manager().Queue()` at the first save and never
    stops it; a SIGKILLed trainer leaves that Manager (and the resource_tracker it keeps alive)
    orphaned, holding the launcher's stdout open. Pre-creating the queue from a Manager started with
    a PR_SET_PDEATHSIG initializer removes the orphan; on a normal exit the Manager is shut down by
    its finalizer.
    """
    global _manager
    import multiprocessing as mp
    from multiprocessing.managers import SyncManager

    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if getattr(filesystem_async, "_results_queue", None) is not None:
        return
    mgr = SyncManager(ctx=mp.get_context("spawn"))
    mgr.start(initializer=die_with_parent)
    _manager = mgr
    filesystem_async._results_queue = mgr.Queue()
