"""The checkpoint results Manager (lcm_runner.train.procutil.install_checkpoint_results_queue) carries
pickled bytes: it never imports torch, and a save's write results come back equal. A real Manager in a
real trainer-like process; the raw proxy is the control (it makes the Manager import torch)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from trainruns import REPO

_PROBE = """
import json, sys
from lcm_runner.train import cpu_compat, procutil
cpu_compat.stub_triton_kernels()
from megatron.core.dist_checkpointing.strategies import filesystem_async
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.storage import WriteResult
from torch.distributed.checkpoint.filesystem import _StorageInfo

procutil.install_checkpoint_results_queue()
q = filesystem_async._results_queue
raw = sys.argv[1] == "raw"
if raw:
    q = q._q  # the Manager's own proxy: unpickled in the Manager
item = {0: [WriteResult(index=MetadataIndex("layer.weight", (0, 0)), size_in_bytes=128,
                        storage_data=_StorageInfo("__0_0.distcp", 0, 128))]}
q.put(item)
back = q.get_nowait()
pid = procutil._manager._process.pid
with open(f"/proc/{pid}/maps") as f:
    torch_in_manager = any("libtorch" in line for line in f)
print(json.dumps({"equal": back == item, "torch_in_manager": torch_in_manager,
                  "type": type(back[0][0]).__name__}))
"""


@pytest.mark.parametrize(("mode", "torch_loaded"), [("pickled", False), ("raw", True)])
def test_the_manager_stores_bytes_and_never_imports_torch(mode: str, torch_loaded: bool) -> None:
    p = subprocess.run(
        [sys.executable, "-c", _PROBE, mode],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out == {"equal": True, "torch_in_manager": torch_loaded, "type": "WriteResult"}, out


def test_an_empty_queue_raises_queue_empty_as_dist_checkpointing_expects() -> None:
    import queue
    from multiprocessing.managers import SyncManager

    from lcm_runner.train.procutil import PickledQueue

    mgr = SyncManager()
    mgr.start()
    try:
        q = PickledQueue(mgr.Queue())
        with pytest.raises(queue.Empty):
            q.get_nowait()
        q.put(RuntimeError("a writer failed"))  # FileSystemWriterAsync puts a worker's exception
        err = q.get_nowait()
        assert isinstance(err, RuntimeError) and str(err) == "a writer failed"
    finally:
        mgr.shutdown()
