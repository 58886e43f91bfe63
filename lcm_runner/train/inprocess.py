"""`--inprocess-restart`: the trainer under nvidia-resiliency-ext's in-process restart (NVRx).

A fault the process survives (an exception on any rank, a hang past --inprocess-hard-timeout-s) is
handled inside the same processes: NVRx aborts the process group on every rank, runs the finalizers
below, and calls the training function again, which builds a fresh process group on a new prefix of
NVRx's store, a fresh model, and resumes from the newest verified checkpoint: from the host copy every
rank kept of it at the save (ckpt_memory.py), or, when any rank lacks it, from disk like any restart.
What it saves against a process restart: the interpreter, the imports, the CUDA context, the allocator's
cache and the checkpoint read. A dead process (SIGKILL, OOM kill, a lost node) is not in its reach: that stays
with the agent (lcm_runner.launch.agent) and the sbatch requeue, which still launch this trainer.

NVRx's own store listens on MASTER_PORT + 2 (Megatron-LM's choice: + 1 is its TCPStore, the launcher's
is MASTER_PORT itself); every rank of the job must run with the flag.
"""

from __future__ import annotations

import datetime
import gc
import os
import time
from dataclasses import dataclass
from typing import Any

from .args import TrainArgs
from .distributed import GroupStore


@dataclass(frozen=True)
class InprocessCall:
    """One iteration of the in-process restart loop, as the trainer sees it."""

    iteration: int  # 0 for the first call, +1 per restart
    group: GroupStore


def _finalize() -> None:
    """Between iterations (after NVRx aborted the process group): drop the model parallel groups and
    the previous iteration's tensors, so the new model fits beside nothing."""
    try:
        from megatron.core import parallel_state as ps

        ps.destroy_model_parallel()
    except Exception:  # a half-initialised state: nothing more to destroy
        pass
    gc.collect()
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def wrapper_kwargs(args: TrainArgs, master_port: int) -> dict[str, Any]:
    """NVRx Wrapper's settings: timeouts from the flags, ordered as NVRx requires
    (soft < hard < barrier, heartbeat interval < heartbeat timeout < barrier)."""
    hard = args.inprocess_hard_timeout_s
    tick = args.inprocess_interval_s
    sec = datetime.timedelta
    return {
        "store_kwargs": {"port": master_port + 2, "timeout": sec(seconds=max(300.0, 2 * hard))},
        "soft_timeout": sec(seconds=hard * 2 / 3),
        "hard_timeout": sec(seconds=hard),
        "heartbeat_interval": sec(seconds=tick),
        "heartbeat_timeout": sec(seconds=min(30.0, hard / 3)),
        "barrier_timeout": sec(seconds=max(120.0, 2 * hard)),
        "completion_timeout": sec(seconds=max(120.0, 2 * hard)),
        "monitor_thread_interval": sec(seconds=tick),
        "monitor_process_interval": sec(seconds=tick),
        "progress_watchdog_interval": sec(seconds=tick),
        "last_call_wait": sec(seconds=tick),
        "termination_grace_time": sec(seconds=5),
    }


def run_inprocess(args: TrainArgs) -> int:
    """Run the trainer under NVRx's Wrapper; returns the trainer's ExitCode (restarts are inside)."""
    import nvidia_resiliency_ext.inprocess as ip
    import torch
    import torch.distributed as dist

    from . import engine
    from .distributed import _default_single_process_env

    _default_single_process_env()  # MASTER_ADDR/PORT, RANK, WORLD_SIZE for a lone process
    port = int(os.environ["MASTER_PORT"])
    health = []
    if torch.cuda.is_available() and args.device != "cpu":
        health.append(ip.health_check.CudaHealthCheck(timeout=datetime.timedelta(seconds=10)))
    max_iterations = args.inprocess_max_restarts + 1

    def _train(call_wrapper: ip.CallWrapper | None = None) -> int:
        assert call_wrapper is not None  # the Wrapper substitutes it
        state = call_wrapper.state
        if state.iteration >= max_iterations:
            print(
                f"lcm-train: in-process restart: {args.inprocess_max_restarts} restarts used; "
                "giving up (exit 1: the launcher's restart policy takes over)",
                flush=True,
            )
            return 1
        if state.iteration:
            print(f"lcm-train: in-process restart {state.iteration} begins t={time.time():.3f}", flush=True)
        store = dist.PrefixStore(f"lcm_inprocess_{state.iteration}", call_wrapper.base_store)
        group = GroupStore(store=store, rank=state.rank, world_size=state.world_size)
        return engine.run(args, InprocessCall(iteration=state.iteration, group=group))

    # NVRx finds the parameter to fill by its annotation, a class (this module's annotations are strings)
    _train.__annotations__ = {"call_wrapper": ip.CallWrapper, "return": int}
    kwargs = wrapper_kwargs(args, port)

    class Finalize(ip.finalize.Finalize):  # NVRx's ThreadedFinalize requires CUDA: this one runs on CPU too
        def __call__(self, state: Any) -> Any:
            _finalize()
            return state

    wrapped = ip.Wrapper(
        finalize=Finalize(),
        health_check=ip.Compose(*health) if len(health) > 1 else (health[0] if health else None),
        **kwargs,
    )(_train)
    return int(wrapped())
