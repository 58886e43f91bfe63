"""Training batches as a pure function of (seed, step, data-parallel rank, micro-batch index).

A resumed run therefore sees exactly the batches the uninterrupted run saw: the only "data position"
is the step number stored in the checkpoint. The trainer (schedule.py) passes data-parallel rank 0 and
the step's global micro-batch index (DP rank x micro-batches per rank + micro-batch), so a step's batches
are the same for any data-parallel layout with the same micro and global batch sizes (a TP x PP x EP run
and a single process see the same tokens).

- `SyntheticTokens`: learnable arithmetic token sequences (start + stride * i mod vocab), so the loss
  visibly falls within a few steps.
- `IndexedTokens`: windows of a Megatron indexed dataset (<prefix>.bin/.idx, as written by
  Megatron-LM's tools/preprocess_data.py), picked by the same seeded generator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch


@dataclass(frozen=True)
class Batch:
    tokens: torch.Tensor  # [micro_batch, seq] int64
    labels: torch.Tensor  # [micro_batch, seq] int64 (tokens shifted by one)


class TokenSource(Protocol):
    vocab_size: int

    def batch(self, step: int, dp_rank: int, micro: int) -> Batch: ...


def _generator(seed: int, step: int, dp_rank: int, micro: int) -> torch.Generator:
    # Mix the coordinates into one 63-bit seed; distinct coordinates give distinct streams.
    key = np.random.SeedSequence([seed, step, dp_rank, micro]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(key[0]) << 31 ^ int(key[1]))


@dataclass(frozen=True)
class SyntheticTokens:
    seed: int
    seq_length: int
    micro_batch_size: int
    vocab_size: int

    def batch(self, step: int, dp_rank: int, micro: int) -> Batch:
        g = _generator(self.seed, step, dp_rank, micro)
        start = torch.randint(0, self.vocab_size, (self.micro_batch_size, 1), generator=g)
        stride = torch.randint(1, 4, (self.micro_batch_size, 1), generator=g)
        seq = (start + stride * torch.arange(self.seq_length + 1)) % self.vocab_size
        return Batch(seq[:, :-1].contiguous(), seq[:, 1:].contiguous())


class IndexedTokens:
    """Random windows of seq_length+1 tokens from a Megatron indexed dataset (documents concatenated)."""

    def __init__(self, path_prefix: str, seed: int, seq_length: int, micro_batch_size: int, vocab_size: int):
        from megatron.core.datasets.indexed_dataset import IndexedDataset

        self._ds = IndexedDataset(path_prefix, mmap=True)
        self.seed, self.seq_length, self.micro_batch_size = seed, seq_length, micro_batch_size
        self.vocab_size = vocab_size
        lengths = np.asarray(self._ds.sequence_lengths, dtype=np.int64)
        self._offsets = np.concatenate([[0], np.cumsum(lengths)])
        self._total = int(self._offsets[-1])
        if self._total < seq_length + 1:
            raise ValueError(
                f"{path_prefix}: {self._total} tokens in all, fewer than --seq-length + 1 = {seq_length + 1}"
            )

    def _window(self, start: int) -> np.ndarray:
        need, out, doc = self.seq_length + 1, [], int(np.searchsorted(self._offsets, start, side="right") - 1)
        off = start - int(self._offsets[doc])
        while need > 0:
            length = int(self._offsets[doc + 1] - self._offsets[doc]) - off
            take = min(need, length)
            if take > 0:
                out.append(np.asarray(self._ds.get(doc, offset=off, length=take), dtype=np.int64))
                need -= take
            doc, off = doc + 1, 0
        return np.concatenate(out)

    def batch(self, step: int, dp_rank: int, micro: int) -> Batch:
        g = _generator(self.seed, step, dp_rank, micro)
        starts = torch.randint(0, self._total - self.seq_length, (self.micro_batch_size,), generator=g)
        seq = torch.from_numpy(np.stack([self._window(int(s)) for s in starts]))
        if int(seq.max()) >= self.vocab_size:
            raise ValueError(f"token id {int(seq.max())} >= --vocab-size {self.vocab_size}")
        return Batch(seq[:, :-1].contiguous(), seq[:, 1:].contiguous())


def make_source(
    data_path: str | None, seed: int, seq_length: int, micro_batch_size: int, vocab_size: int
) -> TokenSource:
    if data_path:
        return IndexedTokens(data_path, seed, seq_length, micro_batch_size, vocab_size)
    return SyntheticTokens(seed, seq_length, micro_batch_size, vocab_size)
