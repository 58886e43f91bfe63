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
