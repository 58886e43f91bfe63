"""The CPU (torch AdamW) optimizer state in checkpoints: per-rank sharded tensors written by the writer (not
one object pickled in the step loop), resumed bitwise; checkpoints of the older layout (one pickled object
per rank) still load, with their optimizer state."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader
from trainruns import REPO, _env, run_one

from lcm_runner.telemetry import load_run, of_event, steps

pytestmark = pytest.mark.slow

FIXTURE = REPO / "tests" / "unit" / "fixtures" / "ckpt-legacy-torch-optimizer"
# the model of the fixture (written by the trainer before 2026-12-03, one rank)
TINY = [
    "--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2", "--ffn-hidden-size", "32",
    "--seq-length", "16", "--micro-batch-size", "1", "--global-batch-size", "1", "--vocab-size", "32",
    "--num-experts", "2", "--moe-router-topk", "2", "--lr", "3e-3", "--seed", "1234", "--device", "cpu",
]  # fmt: skip


def _train(run: Path, *extra: str) -> str:
    code, out = run_one(
        run, [*TINY, "--telemetry-dir", str(run / "telemetry"), *extra], _env("torch-optimizer")
    )
    assert code == 0, out[-6000:]
    return out


def _keys(ckpt: Path) -> list[str]:
    return list(FileSystemReader(str(ckpt)).read_metadata().state_dict_metadata)


def _head(ckpt: Path) -> dict:
    """The optimizer's small object (steps, hyper-parameters) read back with torch's own reader."""
    from torch.distributed.checkpoint import load

    key = next(k for k in _keys(ckpt) if k.startswith("optimizer_torch_head/"))
    box = {key: io.BytesIO()}
    load(box, storage_reader=FileSystemReader(str(ckpt)), no_dist=True)
    value = box[key]  # the planner has unpickled the list megatron saved
    if isinstance(value, io.BytesIO):
        value.seek(0)
        value = torch.load(value, weights_only=False)
    return value[0]


def _losses(run: Path) -> dict[int, str]:
    return {r.step: r.get("loss_hex") for r in steps(load_run(run), rank=0)}


def test_moments_are_sharded_tensors_and_resume_is_bitwise(tmp_path: Path) -> None:
    full = tmp_path / "full"
    _train(full, "--train-iters", "4", "--save-interval", "2", "--keep-last", "0", "--save", str(full / "ck"))
    keys = _keys(full / "ck" / "iter_0000002")
    moments = [k for k in keys if k.startswith("optimizer_torch.rank0.")]
    assert moments and {k.rsplit(".", 1)[1] for k in moments} == {"exp_avg", "exp_avg_sq"}
    assert not [k for k in keys if k.startswith("optimizer_torch/")], "the moments must not be pickled"
    head = _head(full / "ck" / "iter_0000004")
    assert {float(s["step"]) for s in head["scalars"].values()} == {4.0}
    # resume from step 2 of a copy: steps 3 and 4 bitwise those of the uninterrupted run
    part = tmp_path / "part"
    (part / "ck").mkdir(parents=True)
    shutil.copytree(full / "ck" / "iter_0000002", part / "ck" / "iter_0000002")
    (part / "ck" / "latest_checkpointed_iteration.txt").write_text("2\n")
    _train(part, "--train-iters", "4", "--save-interval", "2", "--save", str(part / "ck"))
    assert [r.step for r in of_event(load_run(part), "resume", rank=0)] == [2]
    ref = _losses(full)
    assert _losses(part) == {3: ref[3], 4: ref[4]}


def test_a_checkpoint_of_the_older_layout_loads_with_its_optimizer_state(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    shutil.copytree(FIXTURE, ck)
    assert [k for k in _keys(ck / "iter_0000002") if k.startswith("optimizer_torch/")]  # the pickled object
    run = tmp_path / "run"
    _train(run, "--train-iters", "3", "--save-interval", "1", "--keep-last", "0", "--save", str(ck))
    assert [r.step for r in of_event(load_run(run), "resume", rank=0)] == [2]
    assert sorted(_losses(run)) == [3]
    # saved again in the new layout; the step counters continue from the old state (2 + 1), which they
    # would not (1) had its optimizer state been dropped
    head = _head(ck / "iter_0000003")
    assert {float(s["step"]) for s in head["scalars"].values()} == {3.0}
