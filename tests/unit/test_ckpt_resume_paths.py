"""The loader's choice between the host copy of a checkpoint (in-process restarts) and its files, and
the guard for a model built without drawing its weights (the trainer skips the draw when a checkpoint
is there to load). One process, a gloo group of one; the state is small tensors."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from lcm_runner.ckpt.catalog import write_latest_atomically
from lcm_runner.ckpt.integrity import COMPLETE_MARKER
from lcm_runner.contracts import LATEST_FILE, iter_dir_name
from lcm_runner.train import ckpt_memory as mem
from lcm_runner.train import ckpt_shm, cpu_compat
from lcm_runner.train.checkpoint import CheckpointManager, NoGoodCheckpoint
from lcm_runner.train.ckpt_load import will_resume
from lcm_runner.train.telemetry import TelemetryWriter


@pytest.fixture(scope="module", autouse=True)
def _group(tmp_path_factory: pytest.TempPathFactory):
    cpu_compat.stub_triton_kernels()  # as the trainer does on CPU: megatron imports triton
    store = dist.FileStore(str(tmp_path_factory.mktemp("store") / "f"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture(autouse=True)
def _no_copy():
    mem.drop()
    yield
    mem.drop()


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(2, 3))


def _built() -> SimpleNamespace:
    gpt = _Model()
    return SimpleNamespace(gpt=gpt, optimizer=torch.optim.AdamW(gpt.parameters()), optimizer_impl="torch")


def _manager(d: Path, **kw) -> CheckpointManager:
    tel = TelemetryWriter(d.parent / "tel", 0, 0, "test")
    return CheckpointManager(save_dir=d, load_dir=d, keep_last=2, async_save=False, telemetry=tel,
                             device="cpu", **kw)  # fmt: skip


def _complete(d: Path, step: int) -> None:
    (d / iter_dir_name(step)).mkdir(parents=True)
    (d / iter_dir_name(step) / COMPLETE_MARKER).write_text("{}")
    write_latest_atomically(d, step)


def _events(d: Path, name: str) -> list[dict]:
    lines = (d.parent / "tel").glob("*.jsonl")
    return [r for f in lines for r in map(json.loads, f.read_text().splitlines()) if r["event"] == name]


def test_will_resume(tmp_path: Path) -> None:
    d = tmp_path / "ckpt"
    assert not will_resume(None) and not will_resume(d)
    d.mkdir()
    assert not will_resume(d)
    (d / iter_dir_name(2)).mkdir()  # an incomplete save only: a fresh start
    assert not will_resume(d)
    (d / LATEST_FILE).write_text("garbage")  # a tracker, even damaged: a load, or a stop
    assert will_resume(d)
    (d / LATEST_FILE).unlink()
    (d / iter_dir_name(2) / COMPLETE_MARKER).write_text("{}")
    assert will_resume(d)


def test_a_committed_copy_of_latest_is_restored_without_reading_the_files(tmp_path: Path) -> None:
    d = tmp_path / "ckpt"
    _complete(d, 4)  # marker and latest only: reading its files would fail
    state = {"model": {"w": torch.full((2, 3), 4.0)}, "optimizer": _built().optimizer.state_dict(),
             "rng_state": {"torch_cpu": torch.get_rng_state()}, "lcm": {"seed": 3}}  # fmt: skip
    mem.capture(4, state, pin=False)
    mem.commit(4)
    built = _built()
    step, meta = _manager(d, memory=True).load_latest(built)
    assert (step, meta) == (4, {"seed": 3})
    assert torch.equal(built.gpt.w.detach(), torch.full((2, 3), 4.0))
    assert [r.get("source") for r in _events(d, "resume")] == ["memory"]
    assert mem.usable_step() is None  # used once


@pytest.mark.parametrize("case", ["uncommitted", "other step", "rejected", "memory off"])
def test_any_doubt_loads_from_disk(tmp_path: Path, case: str) -> None:
    d = tmp_path / "ckpt"
    _complete(d, 4)
    mem.capture(4 if case != "other step" else 2, {"model": {"w": torch.ones(2, 3)}}, pin=False)
    if case != "uncommitted":
        mem.commit(4 if case != "other step" else 2)
    if case == "rejected":
        (d / iter_dir_name(4) / "lcm_rejected.json").write_text("{}")
    # the disk path verifies iter 4's files, which are not there: a stop naming them, not the copy
    with pytest.raises(NoGoodCheckpoint):
        _manager(d, memory=case != "memory off").load_latest(_built())
    assert _events(d, "resume") == []


def test_weights_never_drawn_and_no_checkpoint_left_is_a_stop(tmp_path: Path) -> None:
    d = tmp_path / "ckpt"
    d.mkdir()  # the checkpoint seen when the model was built is gone
    with pytest.raises(NoGoodCheckpoint, match="never initialised"):
        _manager(d, model_initialized=False).load_latest(_built())
    assert _manager(d).load_latest(_built()) == (0, {})  # drawn weights: a fresh start is fine


# --- the shared host copy ($LCM_HOST_COPY_DIR, `lcm agent --host-copy`): a new process restores from it


def _forget_shared() -> None:
    """What a new process starts with (its predecessor's buffers and mapping are gone with it)."""
    mem.drop()
    mem.configure(None)
    mem._region = None
    mem._layout = []


@pytest.fixture
def host_copy_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(ckpt_shm.ENV, str(tmp_path / "shm"))
    yield tmp_path / "shm"
    _forget_shared()


def _predecessor_saved(d: Path, step: int, w: float) -> None:
    """A process of this rank saved `step` with its copy in shared memory, then died."""
    mem.configure(ckpt_shm.place_from_env(0, {"save": str(d.resolve()), "world": 1}))
    state = {"model": {"w": torch.full((2, 3), w)}, "optimizer": _built().optimizer.state_dict(),
             "rng_state": {"torch_cpu": torch.get_rng_state()}, "lcm": {"seed": 5}}  # fmt: skip
    mem.capture(step, state, pin=False)
    mem.commit(step, d / iter_dir_name(step) / COMPLETE_MARKER)
    _forget_shared()


def test_a_new_process_restores_the_shared_copy_of_latest(tmp_path: Path, host_copy_dir: Path) -> None:
    d = tmp_path / "ckpt"
    _complete(d, 4)  # marker and latest only: reading its files would fail
    _predecessor_saved(d, 4, 7.0)
    for attempt in (1, 2):  # a second restart before the next save finds the copy again
        built = _built()
        step, meta = _manager(d).load_latest(built)  # the env turns the copy on; no memory=True
        assert (step, meta) == (4, {"seed": 5})
        assert torch.equal(built.gpt.w.detach(), torch.full((2, 3), 7.0))
        assert [r.get("source") for r in _events(d, "resume")] == ["shm"] * attempt
        _forget_shared()


@pytest.mark.parametrize("case", ["marker rewritten", "latest moved on", "no copy", "other save dir"])
def test_any_doubt_about_the_shared_copy_loads_from_disk(
    tmp_path: Path, host_copy_dir: Path, case: str
) -> None:
    d = tmp_path / "ckpt"
    _complete(d, 4)
    if case != "no copy":
        _predecessor_saved(d if case != "other save dir" else tmp_path / "elsewhere", 4, 7.0)
    if case == "marker rewritten":  # the checkpoint on disk is not the one the copy was taken of
        (d / iter_dir_name(4) / COMPLETE_MARKER).write_text('{"rewritten": true}')
    if case == "latest moved on":
        _complete(d, 6)
    with pytest.raises(NoGoodCheckpoint):  # the disk path verifies files that are not there
        _manager(d).load_latest(_built())
    assert _events(d, "resume") == []
