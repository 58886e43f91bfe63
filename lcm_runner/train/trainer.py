"""The step loop of one rank: forward/backward over micro-batches (megatron's schedules, schedule.py), the
gradient reduction, the numerical guard, the optimizer, then telemetry, signals, fault hooks and
checkpoints (CheckpointManager). With `measure_comm` every collective of the step is timed (comm.py).
"""

from __future__ import annotations

import math
import os
import signal
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from lcm_runner.contracts import (
    EVENT_EXIT,
    EVENT_FAULT,
    EVENT_NONFINITE,
    EVENT_REWIND,
    EVENT_START,
    EVENT_STEP,
    ExitCode,
)

from .args import TrainArgs
from .procutil import root_mount
from .telemetry import TelemetryWriter


class InjectedFault(RuntimeError):
    """--fault-raise-at-step: an exception in one rank, the kind of fault a process survives."""


@dataclass
class StepResult:
    loss: float
    step_time_s: float
    comm_time_s: float  # every collective of the step (sum of `comm`)
    grad_norm: float | None
    nonfinite: str = ""  # "loss", "grad", "loss+grad": the guard skipped this step's update
    local_loss: float = math.nan  # this rank's pipeline's loss of its own micro-batches, before the DP
    # all-reduce
    comm_grad_reduce_s: float = 0.0  # the collectives of finalize_model_grads (measure_comm only)
    comm_loss_allreduce_s: float = 0.0  # the loss all-reduces
    comm: dict[str, float] = field(default_factory=dict)  # seconds per collective ("ep.all_to_all_single")


def physical_gpu(device: str, env: dict[str, str] | os._Environ[str] = os.environ) -> int | str | None:
    """The physical GPU of this rank: the CUDA_VISIBLE_DEVICES entry at LOCAL_RANK (an index, or a
    UUID/MIG name as given), LOCAL_RANK itself when every GPU is visible; None off CUDA."""
    if device != "cuda":
        return None
    local = int(env.get("LOCAL_RANK", "0") or 0)
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return local
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if not 0 <= local < len(entries):
        return None
    entry = entries[local]
    return int(entry) if entry.isdigit() else entry


class Trainer:
    startup: dict[str, float]  # seconds of the start-up phases before this object (engine.run), for `start`

    def __init__(self, args: TrainArgs, device: str, dp: int, tel: TelemetryWriter):
        from megatron.core import parallel_state as ps

        from . import model as model_mod
        from .checkpoint import CheckpointManager, Fault
        from .ckpt_load import will_resume
        from .comm import CommTimer
        from .data import make_source
        from .distributed import all_agree
        from .guard import NumericalGuard
        from .schedule import Schedule

        self.args, self.device, self.dp, self.tel = args, device, dp, tel
        self.startup = {}
        self.ps = ps
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.dp_rank = ps.get_data_parallel_rank()
        gbs = args.global_batch_size or args.micro_batch_size * dp
        self.global_batch = gbs
        self.num_micro = gbs // (args.micro_batch_size * dp)
        self.tokens_per_step = gbs * args.seq_length
        load_dir = Path(args.load) if args.load else (Path(args.save) if args.save else None)
        # a checkpoint will be loaded (or the run stops: NoGoodCheckpoint), so the weights need no draw;
        # every rank must agree (a rank that sees none initialises, and so do all)
        resuming = all_agree(will_resume(load_dir) and not args.no_load_rng, device)
        self.built = model_mod.build(args, device, initialize=not resuming)
        self.source = make_source(
            args.data_path, args.seed, args.seq_length, args.micro_batch_size, args.vocab_size
        )
        dev = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")
        self.dev = dev
        seq = args.seq_length
        # explicit causal mask: with None megatron builds it on CUDA (True = masked out)
        self.mask = torch.triu(torch.ones(1, 1, seq, seq, dtype=torch.bool), diagonal=1).to(dev)
        self.pos = torch.arange(seq).unsqueeze(0).expand(args.micro_batch_size, -1).to(dev)
        self.ckpt = CheckpointManager(
            save_dir=Path(args.save) if args.save else None,
            load_dir=load_dir,
            keep_last=args.keep_last,
            async_save=args.async_save,
            writers=args.ckpt_writers,
            async_strategy=args.ckpt_async_strategy,
            telemetry=tel,
            device=device,
            fault=Fault(args.fault_crash_in_save, args.fault_crash_rank),
            good_after_steps=args.ckpt_good_after_steps,
            model_initialized=not resuming,
            memory=args.inprocess_restart,
        )
        self.pp = args.pp
        self.schedule = Schedule(
            self.built,
            self.source,
            device=dev,
            mask=self.mask,
            position_ids=self.pos,
            num_micro=self.num_micro,
            micro_batch_size=args.micro_batch_size,
            seq_length=seq,
            dp_rank=self.dp_rank,
        )
        self.comm = CommTimer(device)
        if args.measure_comm:
            self.comm.install()
        self.guard = (
            NumericalGuard(args.max_nonfinite_skips, args.max_nonfinite_rewinds, dev)
            if args.check_for_nan_in_loss_and_grad
            else None
        )

    def layout(self) -> dict[str, int]:
        """The parallel layout, as the checkpoint's meta and the `start` event record it."""
        a = self.args
        return {"world_size": dist.get_world_size(), "tp": a.tp, "pp": a.pp, "ep": a.ep, "dp": self.dp}

    def meta(self) -> dict[str, Any]:
        a = self.args
        return {
            "seed": a.seed,
            **self.layout(),
            "global_batch_size": self.global_batch,
            "seq_length": a.seq_length,
            "data": a.data_path or "synthetic",
        }

    def _inject_nan(self, step: int, attempt: int) -> bool:
        a = self.args
        return (
            step in a.fault_nan_steps
            and self.rank == a.fault_nan_rank
            and (a.fault_nan_attempts == 0 or attempt < a.fault_nan_attempts)
        )

    def train_step(self, step: int, attempt: int = 0) -> StepResult:
        t0 = time.perf_counter()
        with self.comm.step():
            r = self._step(step, attempt)
        r.step_time_s = time.perf_counter() - t0  # every path of _step ends with a synchronising .item()
        if self.args.measure_comm:
            r.comm = self.comm.collect()
            r.comm_time_s = sum(r.comm.values())
            r.comm_grad_reduce_s = sum(v for k, v in r.comm.items() if k.startswith("grad:"))
            r.comm_loss_allreduce_s = sum(v for k, v in r.comm.items() if k.startswith("loss:"))
        return r

    def _step(self, step: int, attempt: int) -> StepResult:
        from megatron.core.distributed import finalize_model_grads

        b, comm = self.built, self.comm
        b.model.zero_grad_buffer()
        b.optimizer.zero_grad()
        with comm.phase("fwd-bwd"):  # MoE dispatch/combine, sequence-parallel gathers, pipeline transfers
            total = self.schedule.run(step, poison=self._inject_nan(step, attempt))
        with comm.phase("grad"):
            finalize_model_grads([b.model])  # DP + expert-DP grad all-reduce, SP/TP norm grads, embeddings
        if self.guard is not None:
            grads = [p.main_grad for p in b.model.parameters() if getattr(p, "main_grad", None) is not None]
            with comm.phase("guard"):
                verdict = self.guard.check(total, grads)  # ends with .item(): synchronised
            if verdict.bad:  # no optimizer update: the weights stay those of the last healthy step
                return StepResult(math.nan, 0.0, 0.0, None, verdict.what)
        grad_norm: float | None = None
        with comm.phase("optimizer"):  # megatron's optimizer reduces the gradient norm over model parallel
            if b.optimizer_impl == "megatron":
                ok, gn, _ = b.optimizer.step()
                if not ok:
                    raise RuntimeError(f"optimizer step {step} skipped (non-finite gradients)")
                grad_norm = float(gn) if gn is not None else None
            else:
                for w in b.model.parameters():
                    w.grad = w.main_grad
                b.optimizer.step()
        with comm.phase("loss"):
            if self.pp > 1:  # the loss is on the last stage: give it to every stage (the others add 0)
                dist.all_reduce(total, group=self.ps.get_pipeline_model_parallel_group())
            local = total.clone()  # queued before the in-place all-reduce: this pipeline's own loss
            dist.all_reduce(total, group=self.ps.get_data_parallel_group())
        value = total.item() / self.dp  # .item() synchronises the device
        return StepResult(value, 0.0, 0.0, grad_norm, local_loss=local.item())

    _last_skipped = False

    def _on_nonfinite(self, step: int, r: StepResult) -> ExitCode | None:
        """A skipped step: record it; past the budget rewind `latest` and return the exit code."""
        from .guard import rewind

        assert self.guard is not None
        self._last_skipped = True
        self.ckpt.note_step(step, False, r.loss)
        spent = self.guard.record_skip(step)
        n, budget = len(self.guard.skipped), self.guard.max_skips
        self.tel.emit(EVENT_NONFINITE, step=step, what=r.nonfinite, skipped=n, max_skips=budget, durable=True)
        if self.rank == 0:
            print(
                f"lcm-train: step {step}: non-finite {r.nonfinite} on some rank: update and saves skipped "
                f"({n} of {budget} allowed)",
                flush=True,
            )
        if not spent:
            return None
        self.ckpt.finalize(blocking=True)  # a save of an earlier, healthy step may still be in flight
        verdict: tuple[int, str] | None = None
        if self.rank == 0:
            code, reason = rewind(self.ckpt.save_dir, step, self.guard.max_rewinds)
            verdict = (int(code), reason)
        box = [verdict]
        dist.broadcast_object_list(box, src=0)
        code_i, reason = box[0]  # type: ignore[misc]
        code = ExitCode(code_i)
        if self.rank == 0:
            print(f"lcm-train: {reason}; exit {code_i} ({code.name})", flush=True)
        if code == ExitCode.NONFINITE:
            self.tel.emit(EVENT_REWIND, at_step=step, reason=reason, durable=True)
        self.tel.emit(EVENT_EXIT, code=code_i, reason=reason, durable=True)
        return code

    def _hold(self, step: int, path: Path, max_s: float, handler: Any) -> None:
        """An operator drill's pause: wait before `step` while `path` exists (every rank polls the same file
        on shared storage at the same step, so no collective is left waiting on a held peer). A pending
        signal or `max_s` ends the hold; the step then runs and the signal is handled as usual."""
        t0 = time.monotonic()
        if not path.exists():
            return
        if self.rank == 0:
            print(f"[rank0] fault injection: holding before step {step} while {path} exists", flush=True)
        while path.exists() and time.monotonic() - t0 < max_s:
            if handler is not None and handler.pending():
                break
            time.sleep(0.2)
        if self.rank == 0:
            print(f"[rank0] fault injection: hold released after {time.monotonic() - t0:.1f} s", flush=True)

    def stop_requested(self, handler: Any) -> bool:
        flag = torch.tensor([1 if handler is not None and handler.pending() else 0], dtype=torch.int32)
        flag = flag.to(self.dev)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(int(flag.item()))

    def run(self, handler: Any, attempt: int) -> ExitCode:
        a = self.args
        from lcm_runner.ckpt.catalog import CatalogError

        from .checkpoint import read_latest
        from .ckpt_memory import shared as ckpt_shared

        try:
            latest = read_latest(self.ckpt.load_dir) if self.ckpt.load_dir else None
        except CatalogError:  # a damaged tracker file: the load below chooses and rewrites it
            latest = None
        self.tel.emit(
            EVENT_START,
            **self.layout(),
            resumed_from=latest,
            device=self.device,
            backend=dist.get_backend(),
            transformer_impl=self.built.transformer_impl,
            attention=self.built.attention,
            experts=self.built.experts,
            optimizer_impl=self.built.optimizer_impl,
            num_params=self.built.num_params,
            num_microbatches=self.num_micro,
            global_batch_size=self.global_batch,
            seq_length=a.seq_length,
            async_save=a.async_save,
            ckpt_writers=a.ckpt_writers,
            ckpt_async_strategy=a.ckpt_async_strategy if a.async_save else None,
            pid=os.getpid(),
            host=socket.gethostname(),
            local_rank=int(os.environ.get("LOCAL_RANK", "0") or 0),
            gpu=physical_gpu(self.device),
            rootfs=root_mount(),
            startup=self.startup,
            host_copy="shm"
            if self.ckpt.memory and ckpt_shared()
            else ("memory" if self.ckpt.memory else None),
            durable=True,
        )
        start, _meta = self.ckpt.load_latest(self.built, not a.no_load_optim, not a.no_load_rng)
        if self.rank == 0:
            print(
                f"lcm-train: world {dist.get_world_size()} tp {a.tp} pp {a.pp} ep {a.ep} dp {self.dp} "
                f"device {self.device} "
                f"params/rank {self.built.num_params} start step {start + 1} of {a.train_iters}",
                flush=True,
            )
        last_saved = start
        for step in range(start + 1, a.train_iters + 1):
            sched = a.fault_kill_schedule
            scheduled = attempt < len(sched) and sched[attempt] == step and self.rank == attempt % self.world
            if scheduled or (
                a.fault_kill_at_step == step and attempt == 0 and self.rank == a.fault_kill_rank
            ):
                print(
                    f"[rank{self.rank}] fault injection: SIGKILL at step {step} t={time.time():.3f}",
                    flush=True,
                )
                os.kill(os.getpid(), signal.SIGKILL)
            if a.fault_raise_at_step == step and attempt == 0 and self.rank == a.fault_raise_rank:
                t = time.time()
                print(f"[rank{self.rank}] fault injection: exception at step {step} t={t:.3f}", flush=True)
                self.tel.emit(EVENT_FAULT, step=step, kind="raise", durable=True)
                raise InjectedFault(f"fault injection: exception at step {step} on rank {self.rank}")
            if a.fault_sleep_ms:
                time.sleep(a.fault_sleep_ms / 1000.0)
            if step == a.fault_hold_at_step and a.fault_hold_file:
                self._hold(step, Path(a.fault_hold_file), a.fault_hold_max_s, handler)
            r = self.train_step(step, attempt)
            if r.nonfinite:
                code = self._on_nonfinite(step, r)
                if code is not None:
                    return code
                continue
            self.ckpt.note_step(step, True, r.loss)
            rec: dict[str, Any] = dict(
                step=step,
                loss=r.loss,
                local_loss=r.local_loss,
                loss_hex=float(r.loss).hex(),
                step_time_s=round(r.step_time_s, 6),
                tokens_per_s=round(self.tokens_per_step / r.step_time_s, 3),
            )
            if a.measure_comm:
                rec["comm_time_s"] = round(r.comm_time_s, 6)
                rec["comm_grad_reduce_s"] = round(r.comm_grad_reduce_s, 6)
                rec["comm_loss_allreduce_s"] = round(r.comm_loss_allreduce_s, 6)
                rec["comm"] = r.comm
            if r.grad_norm is not None:
                rec["grad_norm"] = r.grad_norm
            self.tel.emit(EVENT_STEP, **rec)
            if self.rank == 0 and (step % a.log_interval == 0 or step == a.train_iters):
                print(
                    f"step {step} loss {r.loss:.6f} ({rec['loss_hex']}) "
                    f"step_time {r.step_time_s * 1000:.1f} ms "
                    f"tokens/s {rec['tokens_per_s']:.0f}",
                    flush=True,
                )
            self.ckpt.finalize(blocking=False)
            if self.stop_requested(handler):
                if a.save:
                    self.ckpt.save(self.built, step, self.meta(), force_sync=True)
                self.ckpt.finalize(blocking=True)
                self.tel.emit(
                    EVENT_EXIT,
                    code=int(ExitCode.REQUEUE),
                    reason="signal: checkpointed, requeue",
                    durable=True,
                )
                return ExitCode.REQUEUE
            self._last_skipped = False
            if a.save and a.save_interval and step % a.save_interval == 0:
                self.ckpt.save(self.built, step, self.meta())
                last_saved = step
        if a.save and last_saved != a.train_iters and a.train_iters > start and not self._last_skipped:
            self.ckpt.save(self.built, a.train_iters, self.meta())
        self.ckpt.finalize(blocking=True)
        self.tel.emit(EVENT_EXIT, code=int(ExitCode.OK), reason="finished", durable=True)
        return ExitCode.OK
