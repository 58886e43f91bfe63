"""The zygote half of the agent: import what the ranks need once, then turn a fork of this warm
process into a training rank (`python -m <module> <args>` semantics through runpy).

Kept apart from the coordination (lcm_runner.launch.agent) so what runs in a forked child is small
and reviewable: no store, no threads, nothing of the agent's state is used there.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib
import os
import pkgutil
import runpy
import signal
import subprocess
import sys
import traceback
from pathlib import Path
from typing import NoReturn

from lcm_runner.launch import procs

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
_PR_SET_CHILD_SUBREAPER = 36


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def become_subreaper() -> None:
    """Orphans of our ranks (helpers they started) are re-parented to us, not to init."""
    _libc().prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


# What lcm_runner.train imports lazily at run time (megatron-core is most of a rank's start-up: about
# 5-9 s of a 12 s start on the 2-core CI machine). Found by diffing sys.modules before/after a run.
_LCM_TRAINER_PRELOAD = [
    "megatron.core",
    "megatron.core.models.gpt.gpt_model",
    "megatron.core.models.gpt.gpt_layer_specs",
    "megatron.core.dist_checkpointing",
    "megatron.core.dist_checkpointing.serialization",
    "megatron.core.distributed",
    "megatron.core.optimizer",
    "megatron.core.transformer.moe.token_dispatcher",
    "megatron.core.transformer.moe.router",
    "multiprocessing.managers",
    "psutil",
]


def exec_rank(
    python: str, module: str, args: list[str], env: dict[str, str], log: Path | None
) -> subprocess.Popen[bytes]:
    """The fallback without a zygote (LCM_AGENT_EXEC=1): a fresh `python -m module args` in its own
    process group, as torchrun would start it (pays interpreter start and imports on every restart)."""
    out = open(log, "ab") if log is not None else None  # noqa: SIM115 - handed to the child
    try:
        return subprocess.Popen(
            [python, "-m", module, *args],
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT if out is not None else None,
            process_group=0,
        )
    finally:
        if out is not None:
            out.close()


def preload(module: str, explicit: list[str]) -> list[str]:
    """Import what the ranks need, once. Default: torch, torch.distributed, every module of the
    trainer's package (not its __main__) and, for lcm_runner.train, the megatron-core modules it
    imports lazily, so a forked rank starts with all of them in memory."""
    # GPU machines: CUDA must not be initialised before fork(); torch's device checks then use NVML
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    names = list(explicit) or ["torch", "torch.distributed"]
    if not explicit and module.startswith("lcm_runner.train"):
        # megatron imports triton unconditionally in one MoE module; the trainer stubs that module
        # when triton is absent (CPU builds), and the stub must exist before megatron is imported.
        compat = importlib.import_module("lcm_runner.train.cpu_compat")
        compat.stub_triton_kernels()
        names += _LCM_TRAINER_PRELOAD
    if not explicit:
        pkg_name = module.rsplit(".", 1)[0] if module.endswith(".__main__") else module
        pkg = importlib.import_module(pkg_name)
        names.append(pkg_name)
        for info in pkgutil.walk_packages(getattr(pkg, "__path__", []), prefix=pkg_name + "."):
            if not info.name.endswith("__main__"):
                names.append(info.name)
    for name in names:
        importlib.import_module(name)
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():  # is_available() itself could cuInit
        raise RuntimeError("CUDA was initialised while preloading: forked ranks could not use it")
    return names


def become_rank(reset: tuple[int, ...], name: str = procs.TRAINER_COMM) -> None:
    """In a freshly forked child: its own process group, killed with the agent, named `name`, the
    agent's signal handlers reset to the default."""
    os.setpgid(0, 0)
    libc = _libc()
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    set_name(name)
    for s in reset:
        signal.signal(s, signal.SIG_DFL)


def set_name(name: str) -> None:
    """The process's comm (what `ps -o comm` and procs.Proc.comm show): lcm-trainer for a rank."""
    _libc().prctl(_PR_SET_NAME, name.encode(), 0, 0, 0)


def run_module(module: str, args: list[str], env: dict[str, str], log: Path | None) -> NoReturn:
    """Run the trainer module as __main__ in this process (a forked child) and exit with its code the way
    an interpreter does."""
    code = 1
    try:
        os.environ.update(env)
        if log is not None:
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.close(fd)
        sys.argv = [module, *args]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        # what a normal interpreter exit does: multiprocessing's finalizers shut down the Manager
        # that dist_checkpointing started (os._exit alone would orphan it and its resource_tracker)
        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def run_rank(
    module: str, args: list[str], env: dict[str, str], log: Path | None, reset: tuple[int, ...]
) -> NoReturn:
    """In a freshly forked child: become a rank (own process group, killed with the agent, named
    lcm-trainer), run the trainer module as __main__, exit with its code the way an interpreter does."""
    try:
        become_rank(reset)
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    run_module(module, args, env, log)
