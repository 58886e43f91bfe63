"""lcm_runner.train.ckpt_memory: the host copy of the last checkpoint that in-process restarts restore."""

from __future__ import annotations

import pytest
import torch

from lcm_runner.train import ckpt_memory as mem


@pytest.fixture(autouse=True)
def _empty():
    mem.drop()
    yield
    mem.drop()


def _state(scale: float = 1.0) -> dict:
    return {
        "model": {"w": torch.full((3, 4), scale), "b": torch.arange(4.0)},
        "optimizer": {
            "state": {0: {"step": torch.tensor(7.0), "exp_avg": torch.ones(3, 4)}},
            "param_groups": [{"lr": 0.1, "params": [0]}],
        },
        "rng_state": {"torch_cpu": torch.get_rng_state()},
        "lcm": {"seed": 1, "layout": (2, 1)},
    }


def test_a_copy_is_usable_only_once_its_checkpoint_is_committed() -> None:
    mem.capture(4, _state(), pin=False)
    assert mem.usable_step() is None and mem.take() is None  # the save is not complete yet
    mem.commit(6)  # another step's completion does not make this copy usable
    assert mem.usable_step() is None
    mem.commit(4)
    assert mem.usable_step() == 4
    snap = mem.take()
    assert snap is not None and snap.step == 4
    assert mem.usable_step() is None and mem.take() is None  # handed over once


def test_the_copy_is_a_copy_with_the_same_structure() -> None:
    src = _state(2.0)
    mem.capture(2, src, pin=False)
    src["model"]["w"].add_(100.0)  # training goes on after the save
    src["optimizer"]["param_groups"][0]["lr"] = 9.0
    mem.commit(2)
    snap = mem.take()
    assert snap is not None
    s = snap.state
    assert torch.equal(s["model"]["w"], torch.full((3, 4), 2.0))
    assert s["optimizer"]["param_groups"][0]["lr"] == 0.1
    assert s["optimizer"]["state"][0]["step"].item() == 7.0
    assert s["lcm"] == {"seed": 1, "layout": (2, 1)} and isinstance(s["lcm"]["layout"], tuple)
    assert torch.equal(s["rng_state"]["torch_cpu"], src["rng_state"]["torch_cpu"])


def test_a_new_save_replaces_the_committed_copy_and_reuses_its_buffers() -> None:
    mem.capture(2, _state(1.0), pin=False)
    mem.commit(2)
    first = list(mem._held.buffers)
    mem.capture(4, _state(3.0), pin=False)
    # while step 4's save is in flight, step 2's copy is gone (one set of buffers): not usable
    assert mem.usable_step() is None
    assert all(a is b for a, b in zip(first, mem._held.buffers, strict=True))
    mem.commit(4)
    snap = mem.take()
    assert snap is not None and torch.equal(snap.state["model"]["w"], torch.full((3, 4), 3.0))


def test_other_shapes_get_new_buffers() -> None:
    mem.capture(2, _state(), pin=False)
    first = mem._held.buffers
    other = _state()
    other["model"]["w"] = torch.zeros(5, 4)
    mem.capture(4, other, pin=False)
    assert mem._held.buffers[0] is not first[0]
    assert mem._held.buffers[0].shape == (5, 4)
