"""Command-line arguments of `lcm-runner train`, named as in Megatron-LM's pretrain_gpt.py.

`parse_args(argv)` returns a `TrainArgs` dataclass; `validate_static(args)` and
`validate_world(args, world_size)` raise `ArgError` with a specific message for anything this build cannot
honour, before any state is touched. The model-shape and parallel-layout rules are in rules.py, shared
with the run config's validation (lcm_runner/config/validation.py); the flag-only rules stay here.

Over 400 lines (about 450) because the parser lists every flag with its help text in one place, beside the
dataclass of the same fields and their flag-only checks: split by argument group, each flag would be
named in three files.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, fields
from pathlib import Path

from .rules import VOCAB_SIZE_DEFAULT, Names, Problem, Shape, shape_problems


class ArgError(ValueError):
    """A flag combination the trainer cannot honour (exit code ExitCode.BAD_ARGS)."""


@dataclass
class TrainArgs:
    # model
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int | None
    seq_length: int
    max_position_embeddings: int | None
    num_experts: int | None
    moe_router_topk: int
    moe_token_dispatcher_type: str
    moe_aux_loss_coeff: float
    moe_grouped_gemm: bool
    vocab_size: int
    # batch / parallelism
    micro_batch_size: int
    global_batch_size: int | None
    tensor_model_parallel_size: int
    pipeline_model_parallel_size: int
    expert_model_parallel_size: int
    expert_tensor_parallel_size: int | None
    sequence_parallel: bool
    # precision / kernels
    bf16: bool
    fp16: bool
    use_flash_attn: bool
    transformer_impl: str
    deterministic: bool
    # optimisation
    train_iters: int
    lr: float
    weight_decay: float
    clip_grad: float
    adam_beta1: float
    adam_beta2: float
    optimizer_impl: str
    seed: int
    # data
    data_path: str | None
    # checkpointing
    save: str | None
    save_interval: int
    load: str | None
    keep_last: int
    async_save: bool
    ckpt_writers: int
    ckpt_async_strategy: str
    no_load_optim: bool
    no_load_rng: bool
    ckpt_good_after_steps: int
    # numerical guard
    check_for_nan_in_loss_and_grad: bool
    max_nonfinite_skips: int
    max_nonfinite_rewinds: int
    # runtime
    device: str
    distributed_timeout_minutes: float
    telemetry_dir: str | None
    log_interval: int
    measure_comm: bool
    exit_signal_handler: bool
    inprocess_restart: bool
    inprocess_max_restarts: int
    inprocess_hard_timeout_s: float
    inprocess_interval_s: float
    # fault injection (tests and the fault stage)
    fault_sleep_ms: int
    fault_hold_at_step: int
    fault_hold_file: str | None
    fault_hold_max_s: float
    fault_kill_at_step: int
    fault_kill_rank: int
    fault_raise_at_step: int
    fault_raise_rank: int
    fault_kill_schedule: list[int]
    fault_crash_in_save: int
    fault_crash_rank: int
    fault_nan_steps: list[int]
    fault_nan_rank: int
    fault_nan_attempts: int

    @property
    def tp(self) -> int:
        return self.tensor_model_parallel_size

    @property
    def pp(self) -> int:
        return self.pipeline_model_parallel_size

    @property
    def ep(self) -> int:
        return self.expert_model_parallel_size


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = parser or argparse.ArgumentParser(
        prog="lcm-runner train",
        description="Megatron (megatron-core) MoE GPT training: GPUs with NCCL, or CPU with gloo.",
    )
    g = p.add_argument_group("model")
    g.add_argument("--num-layers", type=int, required=True)
    g.add_argument("--hidden-size", type=int, required=True)
    g.add_argument("--num-attention-heads", type=int, required=True)
    g.add_argument("--ffn-hidden-size", type=int, default=None, help="default 4 * hidden size")
    g.add_argument("--seq-length", type=int, required=True)
    g.add_argument("--max-position-embeddings", type=int, default=None, help="default: --seq-length")
    g.add_argument("--num-experts", type=int, default=None, help="MoE experts per layer (omit: dense)")
    g.add_argument("--moe-router-topk", type=int, default=2)
    g.add_argument("--moe-token-dispatcher-type", choices=("alltoall", "allgather"), default="alltoall")
    g.add_argument("--moe-aux-loss-coeff", type=float, default=0.0)
    g.add_argument(
        "--moe-grouped-gemm",
        action="store_true",
        help="the local experts as two grouped GEMMs (torch._grouped_mm; TE's grouped MLP with TE): "
        "lcm_runner/train/experts.py",
    )
    g.add_argument(
        "--vocab-size", type=int, default=VOCAB_SIZE_DEFAULT, help="synthetic data vocabulary (and model's)"
    )
    g = p.add_argument_group("batch and parallelism")
    g.add_argument("--micro-batch-size", type=int, required=True)
    g.add_argument("--global-batch-size", type=int, default=None, help="default: micro batch x DP size")
    g.add_argument("--tensor-model-parallel-size", type=int, default=1)
    g.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    g.add_argument("--expert-model-parallel-size", type=int, default=1)
    g.add_argument("--expert-tensor-parallel-size", type=int, default=None)
    g.add_argument("--sequence-parallel", action="store_true", help="implied by MoE with TP > 1")
    g = p.add_argument_group("precision and kernels")
    g.add_argument("--bf16", action="store_true")
    g.add_argument("--fp16", action="store_true", help="not supported (use --bf16); fails clearly")
    g.add_argument(
        "--use-flash-attn",
        action="store_true",
        help="fused attention: Transformer Engine's, else PyTorch SDPA (flash/cuDNN/efficient; math on CPU)",
    )
    g.add_argument(
        "--transformer-impl",
        choices=("auto", "local", "transformer_engine"),
        default="auto",
        help="layer spec: Transformer Engine when installed (auto), else megatron-core's local spec",
    )
    g.add_argument(
        "--deterministic",
        action="store_true",
        help="torch.use_deterministic_algorithms + CUBLAS_WORKSPACE_CONFIG (GPU); CPU is deterministic",
    )
    g = p.add_argument_group("optimisation")
    g.add_argument("--train-iters", type=int, required=True)
    g.add_argument("--lr", type=float, default=1e-3)
    g.add_argument("--weight-decay", type=float, default=0.01)
    g.add_argument("--clip-grad", type=float, default=1.0)
    g.add_argument("--adam-beta1", type=float, default=0.9)
    g.add_argument("--adam-beta2", type=float, default=0.95)
    g.add_argument(
        "--optimizer-impl",
        choices=("auto", "megatron", "torch"),
        default="auto",
        help="megatron: get_megatron_optimizer (GPU); torch: AdamW on main grads (CPU). auto picks by device",
    )
    g.add_argument("--seed", type=int, default=1234)
    g = p.add_argument_group("data")
    g.add_argument(
        "--data-path",
        default=None,
        help="Megatron indexed dataset prefix (<prefix>.bin/.idx); default: deterministic synthetic tokens",
    )
    g = p.add_argument_group("checkpointing")
    g.add_argument("--save", default=None, help="checkpoint directory (Megatron-LM layout)")
    g.add_argument("--save-interval", type=int, default=0, help="save every N steps (0: only on signal)")
    g.add_argument("--load", default=None, help="resume from this directory's latest (default: --save)")
    g.add_argument("--keep-last", type=int, default=3, help="keep the last N complete checkpoints (0: all)")
    g.add_argument("--async-save", action="store_true", help="write shards in a background process")
    g.add_argument(
        "--ckpt-writers",
        type=int,
        default=1,
        help="writer threads per rank (one shard file each: __<rank>_<n>.distcp), each file fsynced",
    )
    g.add_argument(
        "--ckpt-async-strategy",
        choices=("mcore", "nvrx"),
        default="mcore",
        help="with --async-save: megatron-core's forked writer per save (mcore) or NVRx's persistent "
        "checkpoint worker (nvrx, needs nvidia-resiliency-ext >= 0.6)",
    )
    g.add_argument("--no-load-optim", action="store_true")
    g.add_argument("--no-load-rng", action="store_true")
    g.add_argument(
        "--ckpt-good-after-steps",
        type=int,
        default=5,
        help="healthy steps after a checkpoint that make it known-good (retention always keeps the newest)",
    )
    g = p.add_argument_group("numerical guard")
    g.add_argument(
        "--no-check-for-nan-in-loss-and-grad",
        dest="check_for_nan_in_loss_and_grad",
        action="store_false",
        help="do not check loss and gradients for NaN/Inf before each optimizer step",
    )
    g.add_argument(
        "--max-nonfinite-skips",
        type=int,
        default=3,
        help="skip up to N steps with a NaN/Inf loss or gradient, then rewind latest to the newest "
        "known-good checkpoint and exit 77 (NONFINITE) for a restart from it",
    )
    g.add_argument(
        "--max-nonfinite-rewinds",
        type=int,
        default=2,
        help="rewinds to the same known-good checkpoint before exiting 79 (NONFINITE_REPEATED, no restart)",
    )
    g = p.add_argument_group("runtime")
    g.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    g.add_argument(
        "--distributed-timeout-minutes",
        type=float,
        default=0.5,
        help="collective timeout; bounds how long a lost peer can stall the job (default 0.5)",
    )
    g.add_argument(
        "--telemetry-dir",
        default=None,
        help="where rank<R>.jsonl go (default: $LCM_RUN_DIR/telemetry, else <save>/../telemetry)",
    )
    g.add_argument("--log-interval", type=int, default=1)
    g.add_argument(
        "--no-measure-comm",
        dest="measure_comm",
        action="store_false",
        help="skip timing the gradient all-reduce (comm_time_s) separately",
    )
    g.add_argument(
        "--no-exit-signal-handler",
        dest="exit_signal_handler",
        action="store_false",
        help="do not turn SIGUSR1/SIGTERM into save-and-requeue",
    )
    g.add_argument(
        "--inprocess-restart",
        action="store_true",
        help="restart inside the same processes after an exception or a hang on any rank "
        "(nvidia-resiliency-ext's in-process restart: keeps the CUDA context and the imports; a dead "
        "process still needs the agent)",
    )
    g.add_argument(
        "--inprocess-max-restarts", type=int, default=3, help="in-process restarts before giving up"
    )
    g.add_argument(
        "--inprocess-hard-timeout-s",
        type=float,
        default=90.0,
        help="a rank that made no progress for this long is treated as hung (in-process restart)",
    )
    g.add_argument(
        "--inprocess-interval-s",
        type=float,
        default=1.0,
        help="NVRx's monitor, heartbeat and progress intervals and its last-call wait (in-process restart)",
    )
    g = p.add_argument_group("fault injection")
    g.add_argument("--fault-sleep-ms", type=int, default=0, help="sleep this long before each step")
    g.add_argument(
        "--fault-hold-at-step",
        type=int,
        default=0,
        help="before this step every rank waits while --fault-hold-file exists (an operator drill holds "
        "the job mid-run; every rank holds at the same step, so no collective waits on a held peer)",
    )
    g.add_argument("--fault-hold-file", default=None, help="the hold file (on storage every rank sees)")
    g.add_argument(
        "--fault-hold-max-s",
        type=float,
        default=1800.0,
        help="stop holding after this long even if the file is still there",
    )
    g.add_argument(
        "--fault-kill-at-step", type=int, default=0, help="SIGKILL a rank at this step (attempt 0)"
    )
    g.add_argument("--fault-kill-rank", type=int, default=0)
    g.add_argument(
        "--fault-raise-at-step",
        type=int,
        default=0,
        help="raise an exception in a rank at this step (attempt 0): a fault the process survives",
    )
    g.add_argument("--fault-raise-rank", type=int, default=0)
    g.add_argument(
        "--fault-kill-schedule",
        type=_step_list,
        default=[],
        help="comma-separated steps: attempt i SIGKILLs rank (i mod world) at the i-th (many faults)",
    )
    g.add_argument(
        "--fault-crash-in-save",
        type=int,
        default=0,
        help="hard-exit a rank after its shards of this step's checkpoint are written, before it completes",
    )
    g.add_argument("--fault-crash-rank", type=int, default=0)
    g.add_argument(
        "--fault-nan-steps",
        type=_step_list,
        default=[],
        help="comma-separated steps whose loss (and so gradients) become NaN on --fault-nan-rank",
    )
    g.add_argument("--fault-nan-rank", type=int, default=0)
    g.add_argument(
        "--fault-nan-attempts",
        type=int,
        default=0,
        help="inject the NaNs only in the first N attempts (restarts); 0: in every attempt (a bad batch)",
    )
    return p


def _step_list(text: str) -> list[int]:
    try:
        steps = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated step numbers") from None
    if any(s <= 0 for s in steps):
        raise argparse.ArgumentTypeError(f"{text!r}: steps start at 1")
    return steps


def from_namespace(ns: argparse.Namespace) -> TrainArgs:
    names = {f.name for f in fields(TrainArgs)}
    return TrainArgs(**{k: v for k, v in vars(ns).items() if k in names})


def parse_args(argv: list[str] | None = None) -> TrainArgs:
    args = from_namespace(build_parser().parse_args(argv))
    validate_static(args)
    return args


# The shape and layout rules (lcm_runner/train/rules.py, shared with the run config), named as flags.
FLAG_NAMES = Names({"world_size": "world size"}, style="flag")


def _raise_first(problems: list[Problem]) -> None:
    if problems:
        raise ArgError("; ".join(str(p) for p in problems))


def validate_static(args: TrainArgs) -> None:
    """Checks that need no process group. Raises ArgError naming every broken shape rule at once, else
    the first trainer-only problem."""
    _raise_first(shape_problems(Shape.of(args), FLAG_NAMES))
    for name in ("distributed_timeout_minutes", "log_interval"):
        if getattr(args, name) <= 0:
            raise ArgError(f"--{name.replace('_', '-')} {getattr(args, name)}: expected > 0")
    if args.fp16:
        raise ArgError("--fp16 is not supported (no loss scaler wired up); use --bf16")
    if args.save_interval < 0 or args.keep_last < 0:
        raise ArgError("--save-interval and --keep-last must be >= 0")
    for name in ("max_nonfinite_skips", "max_nonfinite_rewinds", "fault_nan_attempts"):
        if getattr(args, name) < 0:
            raise ArgError(f"--{name.replace('_', '-')} must be >= 0 (got {getattr(args, name)})")
    if (args.fault_hold_at_step > 0) != bool(args.fault_hold_file):
        raise ArgError("--fault-hold-at-step (> 0) and --fault-hold-file go together")
    if args.fault_hold_max_s <= 0:
        raise ArgError(f"--fault-hold-max-s {args.fault_hold_max_s}: expected > 0")
    if args.ckpt_good_after_steps < 1:
        raise ArgError(f"--ckpt-good-after-steps must be >= 1 (got {args.ckpt_good_after_steps})")
    if args.save_interval and not args.save:
        raise ArgError("--save-interval needs --save")
    if args.async_save and not args.save:
        raise ArgError("--async-save needs --save")
    if not 1 <= args.ckpt_writers <= 64:
        raise ArgError(f"--ckpt-writers {args.ckpt_writers}: expected 1..64")
    if args.ckpt_async_strategy == "nvrx" and args.async_save:
        from megatron.core.dist_checkpointing.strategies.nvrx import has_nvrx_async_support

        if not has_nvrx_async_support():
            raise ArgError(
                "--ckpt-async-strategy nvrx: nvidia-resiliency-ext (>= 0.6, with its async checkpoint "
                "API) is not installed here; use mcore"
            )
    if not 0.05 <= args.inprocess_interval_s <= 5:
        raise ArgError(f"--inprocess-interval-s {args.inprocess_interval_s}: expected 0.05..5")
    if args.inprocess_max_restarts < 0 or args.inprocess_hard_timeout_s < 10:
        raise ArgError(
            f"--inprocess-max-restarts {args.inprocess_max_restarts} (>= 0) / --inprocess-hard-timeout-s "
            f"{args.inprocess_hard_timeout_s} (>= 10)"
        )
    if args.inprocess_restart:
        try:
            import nvidia_resiliency_ext.inprocess  # noqa: F401
        except ImportError as e:
            raise ArgError(
                f"--inprocess-restart needs nvidia-resiliency-ext's inprocess module ({e}); "
                "install nvidia-resiliency-ext or drop the flag"
            ) from e
    if args.fault_crash_in_save and not args.save:
        raise ArgError("--fault-crash-in-save needs --save")
    if args.data_path is not None:
        prefix = Path(args.data_path)
        for ext in (".bin", ".idx"):
            if not Path(str(prefix) + ext).is_file():
                raise ArgError(f"--data-path {args.data_path}: {prefix}{ext} does not exist")


def validate_world(args: TrainArgs, world_size: int) -> int:
    """Checks against the launched world size; returns the data-parallel size. Raises ArgError."""
    _raise_first(shape_problems(Shape.of(args), FLAG_NAMES, world_size))
    return world_size // (args.tp * args.pp)


def resolve_telemetry_dir(args: TrainArgs) -> Path:
    if args.telemetry_dir:
        return Path(args.telemetry_dir)
    run_dir = os.environ.get("LCM_RUN_DIR")
    if run_dir:
        return Path(run_dir) / "telemetry"
    if args.save:
        return Path(args.save).resolve().parent / "telemetry"
    return Path("telemetry")
