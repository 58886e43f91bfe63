"""Canary for the CPU shims: fails loudly when a megatron-core upgrade changes what they patch."""

from __future__ import annotations

import importlib
import sys

import pytest

from lcm_runner.train import cpu_compat


def test_pinned_megatron_core_version() -> None:
    from importlib.metadata import version

    assert version("megatron-core") == cpu_compat.MCORE_VERSION, (
        "megatron-core changed: review lcm_runner/train/cpu_compat.py and bump MCORE_VERSION"
    )


def test_every_shim_target_still_matches() -> None:
    cpu_compat.stub_triton_kernels()
    assert cpu_compat.check_targets() == []


def test_canary_detects_a_removed_target(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu_compat.stub_triton_kernels()
    td = importlib.import_module("megatron.core.transformer.moe.token_dispatcher")
    monkeypatch.delattr(td, "maybe_move_tensor_to_cpu")
    problems = cpu_compat.check_targets()
    assert any("maybe_move_tensor_to_cpu is gone" in p for p in problems)


def test_canary_detects_a_changed_signature(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu_compat.stub_triton_kernels()
    rnd = importlib.import_module("megatron.core.tensor_parallel.random")
    monkeypatch.setattr(rnd, "model_parallel_cuda_manual_seed", lambda seed, rng_tracker=None: None)
    assert any("signature changed" in p for p in cpu_compat.check_targets())


def test_apply_refuses_when_targets_drift(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_compat, "_applied", False)
    monkeypatch.setattr(cpu_compat, "check_targets", lambda: ["x.y is gone"])
    with pytest.raises(RuntimeError, match="no longer match"):
        cpu_compat.apply()


def test_triton_stub_is_limited_to_the_kernel_module() -> None:
    if importlib.util.find_spec("triton") is not None:
        pytest.skip("triton installed: no stub needed")
    cpu_compat.stub_triton_kernels()
    assert "triton" not in sys.modules  # a global triton stub breaks torch._dynamo
    stub = sys.modules[cpu_compat._TRITON_KERNEL_MODULE]
    with pytest.raises(RuntimeError, match="need triton"):
        stub.paged_stash_copy_kernel()


def test_results_queue_hook_target_exists() -> None:
    """procutil pre-creates dist_checkpointing's Manager queue through this module global."""
    cpu_compat.stub_triton_kernels()
    fsa = importlib.import_module("megatron.core.dist_checkpointing.strategies.filesystem_async")
    assert hasattr(fsa, "_results_queue") and callable(fsa.get_write_results_queue)
