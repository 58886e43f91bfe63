"""Batches are a pure function of (seed, step, dp rank, micro-batch): resume sees the same data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from lcm_runner.train import cpu_compat
from lcm_runner.train.data import IndexedTokens, SyntheticTokens, make_source


def test_synthetic_is_deterministic_and_distinct() -> None:
    a = SyntheticTokens(seed=1, seq_length=16, micro_batch_size=3, vocab_size=50)
    b = SyntheticTokens(seed=1, seq_length=16, micro_batch_size=3, vocab_size=50)
    x, y = a.batch(5, 1, 0), b.batch(5, 1, 0)
    assert torch.equal(x.tokens, y.tokens) and torch.equal(x.labels, y.labels)
    assert x.tokens.shape == (3, 16) and x.tokens.dtype == torch.int64
    assert torch.equal(x.tokens[:, 1:], x.labels[:, :-1])  # labels are the next tokens
    assert int(x.tokens.max()) < 50
    others = [
        a.batch(6, 1, 0),
        a.batch(5, 0, 0),
        a.batch(5, 1, 1),
        SyntheticTokens(2, 16, 3, 50).batch(5, 1, 0),
    ]
    for o in others:
        assert not torch.equal(o.tokens, x.tokens)


def _write_indexed(prefix: Path, docs: list[list[int]]) -> None:
    cpu_compat.stub_triton_kernels()
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(str(prefix) + ".bin", dtype=np.uint16)
    for d in docs:
        builder.add_document(torch.tensor(d), [len(d)])
    builder.finalize(str(prefix) + ".idx")


def test_indexed_dataset_windows(tmp_path: Path) -> None:
    docs = [list(range(i * 10, i * 10 + 7)) for i in range(6)]  # 42 tokens in 6 short documents
    _write_indexed(tmp_path / "corpus", docs)
    src = make_source(str(tmp_path / "corpus"), seed=3, seq_length=12, micro_batch_size=4, vocab_size=100)
    assert isinstance(src, IndexedTokens)
    b1, b2 = src.batch(2, 0, 0), src.batch(2, 0, 0)
    assert torch.equal(b1.tokens, b2.tokens)
    assert b1.tokens.shape == (4, 12)
    flat = [t for d in docs for t in d]
    for row_t, row_l in zip(b1.tokens.tolist(), b1.labels.tolist(), strict=True):
        window = [*row_t, row_l[-1]]
        starts = [i for i in range(len(flat) - 12) if flat[i : i + 13] == window]
        assert starts, f"{window} is not a window of the concatenated documents"
    assert not torch.equal(src.batch(3, 0, 0).tokens, b1.tokens)


def test_indexed_dataset_rejects_out_of_vocab_and_short(tmp_path: Path) -> None:
    _write_indexed(tmp_path / "c", [list(range(200, 230))])
    with pytest.raises(ValueError, match=">= --vocab-size 100"):
        make_source(str(tmp_path / "c"), 1, 8, 2, 100).batch(1, 0, 0)
    with pytest.raises(ValueError, match="fewer than --seq-length"):
        make_source(str(tmp_path / "c"), 1, 64, 2, 1000)
