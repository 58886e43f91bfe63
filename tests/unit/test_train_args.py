"""Argument validation of `lcm-runner train`: specific errors before anything starts."""

from __future__ import annotations

import pytest

from lcm_runner.contracts import ExitCode
from lcm_runner.train.args import ArgError, parse_args, validate_world
from lcm_runner.train.cli import main
from lcm_runner.train.model import resolve_impl, resolve_optimizer_impl

BASE = [
    "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
    "--micro-batch-size", "2", "--train-iters", "4", "--num-experts", "4",
]  # fmt: skip


def test_valid_minimal_parses_with_megatron_names() -> None:
    a = parse_args([*BASE, "--expert-model-parallel-size", "2", "--moe-router-topk", "2", "--seed", "7"])
    assert (a.num_layers, a.hidden_size, a.ep, a.moe_router_topk, a.seed) == (2, 64, 2, 2, 7)
    assert a.distributed_timeout_minutes < 1  # a lost peer must not stall the fault stage for minutes


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--pipeline-model-parallel-size", "3"],
            "--num-layers 2: expected a multiple of --pipeline-model-parallel-size (3)",
        ),
        (
            ["--use-flash-attn", "--hidden-size", "1280", "--num-attention-heads", "4"],
            "--use-flash-attn: expected a head size the fused attention kernels take: --hidden-size (1280) / "
            "--num-attention-heads (4) = 320, must be a multiple of 8 and at most 256",
        ),
        (
            ["--use-flash-attn", "--hidden-size", "48", "--num-attention-heads", "4", "--device", "cuda"],
            "--use-flash-attn: expected a head size the fused attention kernels take: --hidden-size (48) / "
            "--num-attention-heads (4) = 12, must be a multiple of 8",
        ),
        (["--fp16"], "--fp16 is not supported"),
        (
            ["--expert-model-parallel-size", "3"],
            "--num-experts 4: expected a multiple of --expert-model-parallel-size (3)",
        ),
        (["--moe-router-topk", "5"], "--moe-router-topk 5: expected in 1..--num-experts (4)"),
        (["--hidden-size", "66"], "--hidden-size 66: expected a multiple of --num-attention-heads (4)"),
        (["--save-interval", "2"], "--save-interval needs --save"),
        (["--async-save"], "--async-save needs --save"),
        (["--data-path", "/nonexistent/corpus"], "/nonexistent/corpus.bin does not exist"),
        (["--device", "cpu", "--bf16"], "--bf16: expected no bf16 with --device (cpu): bf16 is a GPU option"),
        (["--micro-batch-size", "0"], "--micro-batch-size 0: expected a positive integer (> 0)"),
        (
            ["--max-position-embeddings", "16"],
            "--max-position-embeddings 16: expected at least --seq-length (32)",
        ),
        # rules megatron-core itself enforces at start-up, caught before any process group
        (
            ["--tensor-model-parallel-size", "8", "--num-attention-heads", "4"],
            "--num-attention-heads 4: expected a multiple of --tensor-model-parallel-size (8)",
        ),
        (
            ["--moe-router-topk", "1"],
            "--moe-router-topk 1: expected at least 2: megatron refuses top-1 routing without a pre-softmax",
        ),
        (
            ["--tensor-model-parallel-size", "2", "--ffn-hidden-size", "129"],
            "--ffn-hidden-size 129: expected a multiple of --tensor-model-parallel-size (2)",
        ),
        (
            ["--tensor-model-parallel-size", "2", "--vocab-size", "101"],
            "--vocab-size 101: expected a multiple of --tensor-model-parallel-size (2)",
        ),
        (
            ["--tensor-model-parallel-size", "4", "--seq-length", "30"],
            "--seq-length 30: expected a multiple of --tensor-model-parallel-size (4) (sequence parallelism, "
            "implied by MoE with TP > 1)",
        ),
        (
            ["--sequence-parallel"],
            "--sequence-parallel: expected --tensor-model-parallel-size (1) > 1 (megatron refuses it)",
        ),
        (
            ["--expert-tensor-parallel-size", "4", "--ffn-hidden-size", "130"],
            "--ffn-hidden-size 130: expected a multiple of --expert-tensor-parallel-size (4)",
        ),
        (["--seed", "-1"], "--seed -1: expected in 0..9223372036854775807"),
        (["--fault-hold-at-step", "3"], "--fault-hold-at-step (> 0) and --fault-hold-file go together"),
        (["--fault-hold-file", "/tmp/h"], "--fault-hold-at-step (> 0) and --fault-hold-file go together"),
        (
            ["--fault-hold-at-step", "3", "--fault-hold-file", "/tmp/h", "--fault-hold-max-s", "0"],
            "--fault-hold-max-s 0.0: expected > 0",
        ),
        # no NVRx in the venv (0.4.1, the newest for Debian 12, is outside it: requirements/nvrx-test.lock)
        (["--inprocess-restart"], "--inprocess-restart needs nvidia-resiliency-ext's inprocess module"),
        (["--inprocess-hard-timeout-s", "5"], "--inprocess-hard-timeout-s 5.0 (>= 10)"),
        (["--inprocess-max-restarts", "-1"], "--inprocess-max-restarts -1 (>= 0)"),
    ],
)
def test_static_errors_are_specific(extra: list[str], message: str) -> None:
    with pytest.raises(ArgError) as e:
        parse_args([*BASE, *extra])
    assert message in str(e.value)


def test_dense_model_cannot_have_expert_parallelism() -> None:
    argv = [*BASE[:-2], "--expert-model-parallel-size", "2"]  # BASE ends with --num-experts 4
    with pytest.raises(ArgError, match=r"expected 1 for a dense model \(--num-experts not set\)"):
        parse_args(argv)


@pytest.mark.parametrize(
    ("extra", "world", "message"),
    [
        (["--tensor-model-parallel-size", "2"], 3, "world size 3: expected a multiple of TP (2) x PP (1)"),
        (
            ["--expert-model-parallel-size", "4"],
            2,
            "world size 2: expected a multiple of EP (4) x ETP (1) x PP",
        ),
        (
            ["--global-batch-size", "6"],
            4,
            "--global-batch-size 6: expected a multiple of --micro-batch-size (2) x DP (4) = 8",
        ),
    ],
)
def test_world_size_errors(extra: list[str], world: int, message: str) -> None:
    a = parse_args([*BASE, *extra])
    with pytest.raises(ArgError) as e:
        validate_world(a, world)
    assert message in str(e.value)


def test_every_broken_shape_rule_is_reported_at_once() -> None:
    with pytest.raises(ArgError) as e:
        parse_args([*BASE, "--hidden-size", "66", "--expert-model-parallel-size", "3"])
    assert "--hidden-size 66: expected" in str(e.value) and "--num-experts 4: expected" in str(e.value)


def test_dp_size_and_microbatches() -> None:
    a = parse_args([*BASE, "--global-batch-size", "16", "--expert-model-parallel-size", "2"])
    assert validate_world(a, 4) == 4  # EP is carved out of DP; 16 / (2 x 4) = 2 micro-batches


def test_flash_attention_without_transformer_engine_is_sdpa() -> None:
    from lcm_runner.train.model import attention_kind

    a = parse_args([*BASE, "--use-flash-attn"])
    assert resolve_impl(a, "cpu") == "local" and attention_kind(a, "local") == "sdpa"
    assert attention_kind(parse_args(BASE), "local") == "unfused"
    assert attention_kind(a, "transformer_engine") == "te"
    # a head size no fused kernel takes is refused on GPUs, allowed on CPU (SDPA's math path)
    parse_args([*BASE, "--use-flash-attn", "--hidden-size", "1280", "--device", "cpu"])


def test_pipeline_layout_against_the_world() -> None:
    a = parse_args([*BASE, "--pipeline-model-parallel-size", "2", "--expert-model-parallel-size", "2",
                    "--global-batch-size", "8"])  # fmt: skip
    assert validate_world(a, 4) == 2  # DP = 4 / (TP 1 x PP 2)
    with pytest.raises(
        ArgError, match=r"world size 6: expected a multiple of EP \(2\) x ETP \(1\) x PP \(2\) = 4"
    ):
        validate_world(a, 6)
    with pytest.raises(ArgError, match=r"world size 3: expected a multiple of TP \(1\) x PP \(2\) = 2"):
        validate_world(a, 3)


def test_transformer_engine_requested_but_missing() -> None:
    a = parse_args([*BASE, "--transformer-impl", "transformer_engine"])
    with pytest.raises(ArgError, match="Transformer Engine"):
        resolve_impl(a, "cpu")


def test_optimizer_choice() -> None:
    assert resolve_optimizer_impl(parse_args(BASE), "cpu") == "torch"
    assert resolve_optimizer_impl(parse_args(BASE), "cuda") == "megatron"
    with pytest.raises(ArgError, match="megatron needs CUDA"):
        resolve_optimizer_impl(parse_args([*BASE, "--optimizer-impl", "megatron"]), "cpu")
    with pytest.raises(ArgError, match="no fp32 master weights"):
        resolve_optimizer_impl(parse_args([*BASE, "--bf16", "--optimizer-impl", "torch"]), "cuda")


def test_cli_returns_bad_args_code_before_starting(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*BASE, "--pipeline-model-parallel-size", "3"]) == ExitCode.BAD_ARGS
    assert "pipeline-model-parallel-size (3)" in capsys.readouterr().err


def test_cli_registers_as_subcommand() -> None:
    import argparse

    from lcm_runner.train.cli import add_parser

    top = argparse.ArgumentParser()
    sub = top.add_subparsers()
    add_parser(sub)
    ns = top.parse_args(["train", *BASE, "--expert-model-parallel-size", "2"])
    assert ns.expert_model_parallel_size == 2 and callable(ns.func)
