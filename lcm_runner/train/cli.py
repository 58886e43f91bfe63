"""`lcm-runner train`: registered by lcm_runner/cli.py via add_parser(); also `python -m lcm_runner.train`."""

from __future__ import annotations

import argparse
import sys

from lcm_runner.contracts import ExitCode

from .args import ArgError, build_parser, from_namespace, validate_static


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "train",
        help="train a Megatron MoE GPT (launch it with torchrun or srun for more than one rank)",
        description="Megatron (megatron-core) MoE GPT training: GPUs with NCCL, or CPU with gloo.",
    )
    build_parser(p)
    p.set_defaults(func=_run_namespace)
    return p


def _run_namespace(ns: argparse.Namespace) -> int:
    args = from_namespace(ns)
    try:
        validate_static(args)
    except ArgError as e:
        print(f"lcm-runner train: error: {e}", file=sys.stderr)
        return int(ExitCode.BAD_ARGS)
    if args.inprocess_restart:
        from .inprocess import run_inprocess

        return run_inprocess(args)
    from .engine import run

    return run(args)


def main(argv: list[str] | None = None) -> int:
    return _run_namespace(build_parser().parse_args(argv))
