"""A run config -> the trainer's argv (`python -m lcm_runner.train`, Megatron flag names).

`trainer_args` parses that argv with the trainer's own parser, so the run config's validation sees
exactly the values the trainer will see (lcm_runner/config/validation.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lcm_runner.train.args import TrainArgs

    from .types import RunConfig


def train_argv(
    cfg: RunConfig,
    save_dir: str,
    load_dir: str | None = None,
    telemetry_dir: str | None = None,
    train_iters: int | None = None,
    signal_handler: bool = True,
) -> list[str]:
    """The argument list of each rank's module (`RunConfig.train_module`): `python -m lcm_runner.train`'s,
    or for a Megatron-LM workload the bridge's (lcm_runner/workloads/megatron_lm) with the user's command
    after `--`; `RunConfig.to_train_args` calls it. `signal_handler=False`: the trainer without its
    exit-signal handler (the fault stage's plain-torchrun reference)."""
    if cfg.workload.kind == "megatron-lm":
        return megatron_argv(cfg, save_dir, load_dir, telemetry_dir, train_iters, signal_handler)
    m = cfg.model
    args = [
        "--num-layers",
        str(m.num_layers),
        "--hidden-size",
        str(m.hidden_size),
        "--num-attention-heads",
        str(m.num_attention_heads),
        "--ffn-hidden-size",
        str(m.ffn_hidden_size),
        "--seq-length",
        str(m.seq_length),
        "--micro-batch-size",
        str(m.micro_batch_size),
        "--global-batch-size",
        str(m.global_batch_size),
        "--tensor-model-parallel-size",
        str(m.tp),
        "--pipeline-model-parallel-size",
        str(m.pp),
        "--expert-model-parallel-size",
        str(m.ep),
        "--num-experts",
        str(m.num_experts),
        "--moe-router-topk",
        str(m.moe_router_topk),
        "--seed",
        str(m.seed),
        "--train-iters",
        str(train_iters if train_iters is not None else cfg.train_iters),
        "--save-interval",
        str(cfg.save_interval),
        "--keep-last",
        str(cfg.keep_last),
        "--ckpt-writers",
        str(cfg.checkpoint_writers),
        "--save",
        save_dir,
        "--load",
        load_dir if load_dir is not None else save_dir,
    ]
    if cfg.async_save:
        args.append("--async-save")
    if m.bf16:
        args.append("--bf16")
    if m.use_flash_attn:
        args.append("--use-flash-attn")
    if m.moe_grouped_gemm and m.num_experts:
        args.append("--moe-grouped-gemm")
    args += ["--device", "cuda" if cfg.uses_gpu else "cpu"]
    if telemetry_dir is not None:
        args += ["--telemetry-dir", telemetry_dir]
    if not signal_handler:
        args.append("--no-exit-signal-handler")
    return args


def megatron_argv(
    cfg: RunConfig,
    save_dir: str,
    load_dir: str | None,
    telemetry_dir: str | None,
    train_iters: int | None,
    signal_handler: bool = True,
) -> list[str]:
    """The bridge's argv: its options, then `-- PYTHON <checkout>/<entry> <the user's args + ours>`."""
    from lcm_runner.workloads.megatron_lm import argv as mlm

    w = cfg.workload
    shape, problems = mlm.shape(w.args)
    if shape is None:
        raise ValueError("; ".join(problems))
    args, _ = mlm.compose(
        w.args,
        save=save_dir,
        load=load_dir,
        save_interval=cfg.save_interval,
        train_iters=train_iters if train_iters is not None else cfg.train_iters,
        gpu=cfg.uses_gpu,
        signal_handler=signal_handler,
    )
    script = w.script
    return [
        "--telemetry-dir",
        telemetry_dir or f"{save_dir}/telemetry",
        "--seq-length",
        str(shape.seq_length),
        "--exit-signal",
        shape.exit_signal,
        "--",
        cfg.python,
        script,
        *args,
    ]


def megatron_arg_changes(cfg: RunConfig) -> list[str]:
    """What the runner adds to or overrides in the user's Megatron-LM arguments, one line each."""
    from lcm_runner.workloads.megatron_lm import argv as mlm

    _, changes = mlm.compose(
        cfg.workload.args,
        save=f"{(cfg.checkpoint_dir or '<run dir>/checkpoints').rstrip('/')}/<stage>",
        load=None,
        save_interval=cfg.save_interval,
        train_iters=cfg.train_iters,
        gpu=cfg.uses_gpu,
    )
    return [c.describe() for c in changes]


def trainer_args(cfg: RunConfig) -> TrainArgs:
    """The trainer's parsed (not yet validated) arguments for this config, as a launch would pass them.

    Parsed by lcm_runner.train.args (no torch import). Raises ValueError if the trainer's parser
    refuses the argv (argparse's own message is on stderr).
    """
    from lcm_runner.train.args import build_parser, from_namespace

    parser = build_parser()
    try:
        ns = parser.parse_args(train_argv(cfg, "/checkpoints"))
    except SystemExit as exc:  # argparse exits on a value it cannot parse
        raise ValueError("the trainer's parser refuses the generated arguments") from exc
    return from_namespace(ns)
