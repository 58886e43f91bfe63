"""lcm_runner.train.ckpt_shm + ckpt_memory's shared-memory backing: the host copy of the last checkpoint
that a rank restarted after its predecessor's death restores from ($LCM_HOST_COPY_DIR)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lcm_runner.train import ckpt_memory as mem
from lcm_runner.train import ckpt_shm

REPO = Path(__file__).resolve().parents[2]
IDENT = {"save": "/ckpt", "world": 2}


def _reset() -> None:
    """What a new process starts with."""
    mem.drop()
    mem.configure(None)
    mem._region = None
    mem._layout = []
    mem._skeleton = None


@pytest.fixture(autouse=True)
def _clean():
    _reset()
    yield
    _reset()


def _state(scale: float = 1.0) -> dict:
    return {
        "model": {
            "w": torch.full((3, 4), scale),
            "b": torch.arange(4.0),
            "h": torch.ones(5, dtype=torch.bfloat16),
        },
        "optimizer": {
            "state": {0: {"step": torch.tensor(7.0), "exp_avg": torch.ones(3, 4)}},
            "param_groups": [{"lr": 0.1, "params": [0]}],
        },
        "rng_state": {"torch_cpu": torch.get_rng_state()},
        "lcm": {"seed": 1, "layout": (2, 1)},
    }


def _marker(tmp_path: Path, text: str = '{"step": 4}') -> Path:
    m = tmp_path / "iter_0000004" / "lcm_complete.json"
    m.parent.mkdir(parents=True, exist_ok=True)
    m.write_text(text)
    return m


def _place(tmp_path: Path, rank: int = 0, ident: dict | None = None) -> ckpt_shm.Place:
    return ckpt_shm.Place(tmp_path / "shm" / f"rank{rank}", {**(ident or IDENT), "rank": rank})


def test_a_committed_copy_is_found_by_the_next_process_with_its_values_and_structure(tmp_path: Path) -> None:
    place = _place(tmp_path)
    mem.configure(place)
    src = _state(2.0)
    mem.capture(4, src, pin=False)
    mem.commit(4, _marker(tmp_path))
    src["model"]["w"].add_(100.0)  # training goes on after the save
    _reset()
    mem.configure(place)
    assert mem.attach(pin=False) == 4
    assert mem.usable_step() == 4
    assert mem.held_marker() == ckpt_shm.marker_digest(_marker(tmp_path))
    s = mem.take().state
    assert torch.equal(s["model"]["w"], torch.full((3, 4), 2.0))
    assert s["model"]["h"].dtype == torch.bfloat16 and torch.equal(
        s["model"]["h"], torch.ones(5, dtype=torch.bfloat16)
    )
    assert s["optimizer"]["state"][0]["step"].item() == 7.0 and s["optimizer"]["state"][0]["step"].shape == ()
    assert s["optimizer"]["param_groups"] == [{"lr": 0.1, "params": [0]}]
    assert s["lcm"] == {"seed": 1, "layout": (2, 1)}
    assert torch.equal(s["rng_state"]["torch_cpu"], src["rng_state"]["torch_cpu"])
    # a shared copy is kept, not handed over: a second restart before the next save finds it again
    assert mem.take() is not None and mem.usable_step() == 4


def test_nothing_is_usable_between_a_capture_and_its_commit(tmp_path: Path) -> None:
    place = _place(tmp_path)
    mem.configure(place)
    mem.capture(2, _state(1.0), pin=False)
    mem.commit(2, _marker(tmp_path))
    mem.capture(4, _state(3.0), pin=False)  # step 4's save is in flight: step 2's copy is being overwritten
    assert not (place.dir / ckpt_shm.MANIFEST).exists()
    _reset()
    mem.configure(place)
    assert mem.attach(pin=False) is None  # the process died before step 4 completed: load from disk


def test_a_copy_of_another_job_rank_or_world_is_not_used(tmp_path: Path) -> None:
    mem.configure(_place(tmp_path))
    mem.capture(4, _state(), pin=False)
    mem.commit(4, _marker(tmp_path))
    for other in ({"save": "/other", "world": 2}, {"save": "/ckpt", "world": 4}):
        _reset()
        mem.configure(ckpt_shm.Place(tmp_path / "shm" / "rank0", {**other, "rank": 0}))
        assert mem.attach(pin=False) is None, other
    _reset()
    mem.configure(_place(tmp_path, rank=1))
    assert mem.attach(pin=False) is None


def test_the_data_file_is_reused_for_the_same_layout_and_replaced_for_another(tmp_path: Path) -> None:
    place = _place(tmp_path)
    mem.configure(place)
    mem.capture(2, _state(1.0), pin=False)
    first = mem._region.path
    mem.commit(2, _marker(tmp_path))
    mem.capture(4, _state(3.0), pin=False)
    assert mem._region.path == first
    other = _state()
    other["model"]["w"] = torch.zeros(50, 4)
    mem.capture(6, other, pin=False)
    assert mem._region.path != first and not first.exists()
    assert sorted(p.name for p in place.dir.iterdir()) == [mem._region.path.name]


def test_a_damaged_manifest_or_a_short_data_file_loads_from_disk(tmp_path: Path, capsys) -> None:
    place = _place(tmp_path)
    mem.configure(place)
    mem.capture(4, _state(), pin=False)
    mem.commit(4, _marker(tmp_path))
    data = mem._region.path
    _reset()
    (place.dir / ckpt_shm.MANIFEST).write_text("{not json")
    mem.configure(place)
    assert mem.attach(pin=False) is None
    # a valid manifest whose data file was cut short
    mem.capture(4, _state(), pin=False)
    mem.commit(4, _marker(tmp_path))
    data = mem._region.path
    _reset()
    os.truncate(data, 100)
    mem.configure(place)
    assert mem.attach(pin=False) is None
    assert "not usable" in capsys.readouterr().out


def test_restoring_on_cpu_copies_out_of_the_shared_buffers(tmp_path: Path) -> None:
    mem.configure(_place(tmp_path))
    mem.capture(4, _state(2.0), pin=False)
    mem.commit(4, _marker(tmp_path))
    snap = mem.take()
    restored = mem.restore_source(snap, "cpu")
    restored["model"]["w"].add_(1.0)  # the optimizer would update what it was given in place
    assert torch.equal(snap.state["model"]["w"], torch.full((3, 4), 2.0))


def test_a_full_shared_memory_filesystem_drops_the_copy_for_the_run(tmp_path: Path, capsys) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    small = tmp_path / "tiny"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(small)], check=True)
    try:
        mem.configure(ckpt_shm.Place(small / "rank0", {**IDENT, "rank": 0}))
        big = _state()
        big["model"]["w"] = torch.zeros(256, 1024)  # 1 MiB: more than the 64 KiB filesystem holds
        mem.capture(4, big, pin=False)  # no SIGBUS, no exception: the copy is off for this run
        assert not mem.shared() and mem.usable_step() is None
        assert "keeping none for this run" in capsys.readouterr().out
        assert list((small / "rank0").glob("data.*")) == []
    finally:
        subprocess.run(["umount", str(small)], check=False)


_CHILD = """
import json, sys
from pathlib import Path
import torch
from lcm_runner.train import ckpt_memory as mem, ckpt_shm
place_dir, ident, marker, role = json.loads(sys.argv[1])
mem.configure(ckpt_shm.Place(Path(place_dir), {**ident, "rank": 0}))
if role == "write":
    mem.capture(4, {"w": torch.arange(12.0).reshape(3, 4), "meta": {"it": 4}}, pin=False)
    mem.commit(4, Path(marker))
else:
    step = mem.attach(pin=False)
    s = mem.take().state
    out = {"step": step, "w": s["w"].tolist(), "meta": s["meta"], "marker": mem.held_marker()}
    print(json.dumps(out))
"""


def test_another_process_restores_what_this_one_committed(tmp_path: Path) -> None:
    """The real case: the copy outlives the process that took it (here it exits; the agent's ranks die)."""
    marker = _marker(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def child(role: str) -> str:
        arg = json.dumps([str(tmp_path / "shm" / "rank0"), IDENT, str(marker), role])
        p = subprocess.run(
            [sys.executable, "-c", _CHILD, arg],
            env=env,
            timeout=120,
            capture_output=True,
            text=True,
            check=True,
        )
        return p.stdout

    child("write")
    got = json.loads(child("read").strip().splitlines()[-1])
    assert got == {
        "step": 4,
        "w": torch.arange(12.0).reshape(3, 4).tolist(),
        "meta": {"it": 4},
        "marker": ckpt_shm.marker_digest(marker),
    }
