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
) -> list[str]:
    """The `python -m lcm_runner.train` argument list; `RunConfig.to_train_args` calls it."""
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
        "--save",
        save_dir,
        "--load",
        load_dir if load_dir is not None else save_dir,
    ]
    if m.bf16:
        args.append("--bf16")
    if m.use_flash_attn:
        args.append("--use-flash-attn")
    args += ["--device", "cuda" if cfg.uses_gpu else "cpu"]
    if telemetry_dir is not None:
        args += ["--telemetry-dir", telemetry_dir]
    return args


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
