"""The training entry: device and CPU shims, signals, the process group, the launched world's checks,
model parallelism and seeds, then the step loop (trainer.py), mapped to an exit code (ExitCode).

By concern: distributed.py (device, process group), trainer.py (the step loop), checkpoint.py.
"""

from __future__ import annotations

import os
import signal
import time
import traceback
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from lcm_runner.contracts import EVENT_EXIT, EVENT_INPROCESS_RESTART, EVENT_SIGNAL, ExitCode

from . import cpu_compat
from .args import ArgError, TrainArgs, resolve_telemetry_dir, validate_world
from .distributed import init_distributed, resolve_device
from .telemetry import TelemetryWriter, attempt_from_env, job_from_env
from .trainer import StepResult, Trainer

if TYPE_CHECKING:
    from .inprocess import InprocessCall

__all__ = ["StepResult", "Trainer", "init_distributed", "resolve_device", "run"]


def run(args: TrainArgs, inprocess: InprocessCall | None = None) -> int:
    """Train; returns an ExitCode. Must be called from a `__main__`-guarded entry point.

    `inprocess` (lcm_runner.train.inprocess): one iteration of NVRx's in-process restart: the process
    group on the store and rank it gives, the attempt counted on by its iteration, and an unexpected
    exception raised to it (it restarts every rank) instead of turned into exit code 1."""
    from .signals import ExitSignalHandler

    warnings.filterwarnings("ignore", module=r"megatron\..*")
    device = resolve_device(args)
    if device == "cpu":
        cpu_compat.stub_triton_kernels()
        cpu_compat.apply()
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1") or 1))
    elif args.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    handler = ExitSignalHandler() if args.exit_signal_handler else None
    if handler is not None:
        handler.install()  # before the process group: a signal during setup is not lost
    t0 = time.monotonic()
    init_distributed(device, args.distributed_timeout_minutes, inprocess.group if inprocess else None)
    startup = {"distributed_s": round(time.monotonic() - t0, 4)}  # the start event's phases
    rank, world = dist.get_rank(), dist.get_world_size()
    from . import model as model_mod

    try:
        dp = validate_world(args, world)
        model_mod.resolve_impl(args, device)
        model_mod.resolve_optimizer_impl(args, device)
    except ArgError as e:
        if rank == 0:
            print(f"lcm-runner train: error: {e}", flush=True)
        dist.destroy_process_group()
        return int(ExitCode.BAD_ARGS)
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel

    from .checkpoint import CheckpointSaveFailed, NoGoodCheckpoint, read_latest

    attempt = attempt_from_env() + (inprocess.iteration if inprocess else 0)
    tel = TelemetryWriter(resolve_telemetry_dir(args), rank, attempt, job_from_env())
    if handler is not None:
        orig = handler._handle

        def _record(signum: int, frame: Any) -> None:
            orig(signum, frame)
            tel.emit_from_signal_handler(EVENT_SIGNAL, name=signal.Signals(signum).name)

        for sig in (signal.SIGUSR1, signal.SIGTERM):
            signal.signal(sig, _record)
    try:
        t0 = time.monotonic()
        ps.initialize_model_parallel(
            tensor_model_parallel_size=args.tp,
            pipeline_model_parallel_size=args.pp,
            expert_model_parallel_size=args.ep,
            expert_tensor_parallel_size=args.expert_tensor_parallel_size,
            # the subgroups time out as the default group does (megatron-core's own default is 30 min)
            distributed_timeout_minutes=args.distributed_timeout_minutes,
        )
        torch.manual_seed(args.seed)  # use_cpu_initialization draws weights from the CPU generator
        # The default RNG tracker needs CUDA; the "inference" tracker is valid because dropout is 0.
        tensor_parallel.model_parallel_cuda_manual_seed(args.seed, inference_rng_tracker=device == "cpu")
        startup["model_parallel_s"] = round(time.monotonic() - t0, 4)
        t0 = time.monotonic()
        trainer = Trainer(args, device, dp, tel)
        startup["build_s"] = round(time.monotonic() - t0, 4)  # model, optimizer, checkpoint manager
        trainer.startup = startup
        code = trainer.run(handler, attempt)
    except (CheckpointSaveFailed, NoGoodCheckpoint) as e:
        code = (
            ExitCode.CKPT_SAVE_FAILED if isinstance(e, CheckpointSaveFailed) else ExitCode.NO_GOOD_CHECKPOINT
        )
        if rank == 0:
            latest = (
                read_latest(Path(args.save)) if isinstance(e, CheckpointSaveFailed) and args.save else None
            )
            tail = f"; latest stays at step {latest}, the partial checkpoint was removed" if latest else ""
            print(f"lcm-train: {e}{tail}; exit {int(code)} ({code.name})", flush=True)
        tel.emit(EVENT_EXIT, code=int(code), reason=str(e)[:500], durable=True)
        tel.close()
        return int(code)
    except Exception as e:
        if inprocess is not None:
            reason = f"{type(e).__name__}: {e}"[:500]
            tel.emit(EVENT_INPROCESS_RESTART, iteration=inprocess.iteration + 1, reason=reason, durable=True)
            tel.close()
            raise
        traceback.print_exc()
        tel.emit(
            EVENT_EXIT, code=int(ExitCode.FAILURE), reason=f"{type(e).__name__}: {e}"[:500], durable=True
        )
        tel.close()
        return int(ExitCode.FAILURE)
    tel.close()
    ps.destroy_model_parallel()
    dist.destroy_process_group()
    return int(code)
