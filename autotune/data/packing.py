"""Packed batching: documents concatenated into one stream, cut into full windows."""

from __future__ import annotations

import numpy as np
import torch

from autotune.data.datasets import TokenDataset

# A packed stream is materialized; 4M tokens (16 MB as int32) is thousands of windows,
# more than one measurement uses, whatever the corpus size.
PACKED_MAX_TOKENS = 1 << 22


class PackedDataset:
    """Documents concatenated, in a seeded random order, into one stream cut into windows
    of seq_len + 1 tokens at a stride of seq_len: consecutive windows share one token, so
    every position has a label and nothing is padded. The stream is materialized once, up
    to `max_tokens` tokens (lazily generated data has no stream to slice)."""

    def __init__(
        self, dataset: TokenDataset, *, seq_len: int, seed: int = 0, max_tokens: int = PACKED_MAX_TOKENS
    ) -> None:
        order = np.random.default_rng(seed).permutation(len(dataset))
        # Enough documents for max_tokens + 1 tokens by their lengths (upper bounds: may fall short).
        bounds = np.cumsum(np.asarray(dataset.lengths, dtype=np.int64)[order])
        count = int(np.searchsorted(bounds, max_tokens + 1)) + 1
        stream = torch.cat([dataset[int(i)] for i in order[:count]])[: max_tokens + 1]
        self.stream = stream.to(torch.int32)  # half the memory of int64; ids are far below 2**31
        self.seq_len = seq_len
        self.lengths: np.ndarray = np.full(max(len(stream) - 1, 0) // seq_len, seq_len + 1)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> torch.Tensor:
        i = range(len(self))[i]
        start = i * self.seq_len
        return self.stream[start : start + self.seq_len + 1].long()
