"""Restoring the RNG states from the host copy (lcm_runner.train.ckpt_state._set_rng_state): each state
is a view into one shared-memory mapping (ckpt_shm.Region.map_views), at a storage offset. torch's CPU
generator reads a state at base + offset counted in 5056-byte units: a view one byte in got another
state, one deep in a large mapping made the rank die of SIGSEGV (the warm restart on an H100,
2026-12-07). Run in a child process, since the failure is a crash."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from trainruns import REPO

_PROBE = r"""
import json, sys, types
from pathlib import Path
import torch
from lcm_runner.train import ckpt_shm
from lcm_runner.train.ckpt_state import CheckpointState

mode = sys.argv[1]
torch.manual_seed(1)
state = torch.get_rng_state()
expected = torch.rand(4).tolist()
torch.manual_seed(2)  # what a restarted rank has before its restore
n = state.numel()
if mode == "one-byte":
    buf = torch.zeros(2 * n + 1, dtype=torch.uint8)
    buf[1 : n + 1] = state
    view = buf[1 : n + 1]
else:  # deep in a 64 MiB shared-memory region, after other tensors, as the host copy lays them out
    place = ckpt_shm.Place(Path(sys.argv[2]) / "rank0", {"rank": 0})
    filler = torch.zeros(16 * 1024 * 1024)
    layout, size = ckpt_shm.layout_of([filler, state])
    region = ckpt_shm.Region.create(place, size, pin=False)
    views = region.map_views(layout)
    views[1].copy_(state)
    view = views[1]
assert view.storage_offset() > 0 and torch.equal(view, state)
CheckpointState._set_rng_state(types.SimpleNamespace(device="cpu"), {"torch_cpu": view})
print(json.dumps({"offset": view.storage_offset(), "same_state": torch.equal(torch.get_rng_state(), state),
                  "same_draws": torch.rand(4).tolist() == expected}))
"""


@pytest.mark.parametrize("mode", ["one-byte", "shm-region"])
def test_a_state_viewed_inside_a_larger_buffer_restores_that_state(mode: str, tmp_path) -> None:
    p = subprocess.run(
        [sys.executable, "-c", _PROBE, mode, str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert p.returncode == 0, f"exit {p.returncode}: {p.stderr[-2000:]}"
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["offset"] > 0 and out["same_state"] and out["same_draws"], out
