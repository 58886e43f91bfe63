"""lcm_runner.train.ckpt_errors.is_comm_failure: a save that failed because a peer went away is told apart
from one the storage failed. The first restarts from the last good checkpoint (the agent, or a requeue); the
second stops the run with CKPT_SAVE_FAILED (80), which nothing restarts."""

from __future__ import annotations

import errno
import os
import traceback

import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from lcm_runner.train.ckpt_errors import describe_cause, is_comm_failure

GLOO = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
    "[10.89.42.12]:42112. This is typically caused by a remote worker crashing."
)  # what a rank's save raised on the lab when its peer node was cut off


def _chained(outer: BaseException, inner: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as e:
            raise outer from e
    except BaseException as got:
        return got


def test_a_lost_peer_is_a_comm_failure() -> None:
    assert is_comm_failure(RuntimeError(GLOO))
    assert is_comm_failure(RuntimeError("Connection reset by peer"))
    assert is_comm_failure(dist.DistNetworkError("store gone"))
    assert is_comm_failure(dist.DistStoreError("wait timeout after 30000ms"))
    # wrapped the way dist_checkpointing reports a rank's failure
    assert is_comm_failure(CheckpointException("save", {1: (RuntimeError(GLOO), traceback.StackSummary())}))
    assert is_comm_failure(_chained(RuntimeError("async save failed"), RuntimeError(GLOO)))


def test_storage_failures_stay_save_failures() -> None:
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/ckpt/iter_0000020/__0_0.distcp")
    assert not is_comm_failure(full)
    assert not is_comm_failure(OSError(errno.EIO, os.strerror(errno.EIO)))
    assert not is_comm_failure(CheckpointException("save", {0: (full, traceback.StackSummary())}))
    # a full disk wins over a peer that also went away in the same save
    assert not is_comm_failure(_chained(RuntimeError(GLOO), full))
    assert not is_comm_failure(RuntimeError("shard checksum mismatch"))
    assert not is_comm_failure(ValueError("unexpected state dict key"))
    assert describe_cause(full).startswith("No space left on device [ENOSPC]")
