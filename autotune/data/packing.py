"""Packed batching: documents concatenated into one stream, cut into full windows, with the
document boundaries kept (for attention_mask=document)."""

from __future__ import annotations

import numpy as np
import torch

from autotune.data.datasets import TokenDataset

# A measurement's packed stream is materialized: at most 4096 windows (epochs longer than that
# take them in turn) and 4M tokens (16 MB as int32), whatever the corpus size; made from the
# synthetic corpus's short documents, 4M tokens at a context of 128 take seconds. Training packs
# the whole data set (`max_tokens=None`): an epoch is every token, not the seeded first 4M.
PACKED_WINDOWS = 4096
PACKED_MAX_TOKENS = 1 << 22


class PackedDataset:
    """Documents concatenated, in a seeded random order, into one stream cut into windows
    of seq_len + 1 tokens at a stride of seq_len: consecutive windows share one token, so
    every position has a label and nothing is padded. The stream is materialized once (4
    bytes a token), up to `max_tokens` tokens and PACKED_WINDOWS windows (lazily generated data
    has no stream to slice); an epoch then has as many windows as the dataset's tokens make, the
    stream's taken in turn, so a corpus (or a measurement's synthetic data) larger than the
    stream gives epochs as long as its own, not the stream's (at GPT-2's largest budget 4M tokens
    were an epoch of 32 steps, and every epoch starts non-persistent DataLoader workers anew).
    With `max_tokens=None` it is the whole data set, every window once, and the remainder short
    of a window is a last, shorter window, so that an epoch trains on every token.

    Where each document (each item of `dataset`: a document or a piece of a long one)
    starts in the stream is kept in `doc_starts`. With `with_documents`, item i is
    (window, document_ids): the document index of each token, counted from the window's
    first document, for attention that stops at document boundaries."""

    def __init__(
        self,
        dataset: TokenDataset,
        *,
        seq_len: int,
        seed: int = 0,
        max_tokens: int | None = PACKED_MAX_TOKENS,
        with_documents: bool = False,
    ) -> None:
        whole = max_tokens is None
        if not whole:
            max_tokens = min(max_tokens, PACKED_WINDOWS * seq_len)
        order = np.random.default_rng(seed).permutation(len(dataset))
        if whole:
            documents = [dataset[int(i)] for i in order]
            stream = torch.cat(documents) if documents else torch.zeros(0, dtype=torch.long)
        else:
            # Enough documents for max_tokens + 1 tokens by their lengths (upper bounds: may fall short).
            bounds = np.cumsum(np.asarray(dataset.lengths, dtype=np.int64)[order])
            count = int(np.searchsorted(bounds, max_tokens + 1)) + 1
            documents = [dataset[int(i)] for i in order[:count]]
            stream = torch.cat(documents)[: max_tokens + 1]
        self.stream = stream.to(torch.int32)  # half the memory of int64; ids are far below 2**31
        # Real lengths, not the planned ones (those may be upper bounds).
        starts = np.cumsum([0] + [len(doc) for doc in documents[:-1]], dtype=np.int64)
        self.doc_starts: np.ndarray = starts[starts < len(stream)]
        self.seq_len = seq_len
        self.with_documents = with_documents
        windows, rest = divmod(max(len(stream) - 1, 0), seq_len)
        if whole:
            # The remainder, short of a window, is one shorter window (the collate pads it) so every
            # token is trained on; not with documents (their batches are stacked whole).
            tail = [rest + 1] if rest and not with_documents else []
            self.lengths: np.ndarray = np.array([seq_len + 1] * windows + tail, dtype=np.int64)
            self.windows = len(self.lengths)
        else:
            self.windows = windows  # distinct windows in the stream, taken in turn
            epoch = max(windows, int(np.sum(dataset.lengths, dtype=np.int64)) // seq_len) if windows else 0
            self.lengths = np.full(epoch, seq_len + 1)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        i = range(len(self))[i] % self.windows
        start = i * self.seq_len
        window = self.stream[start : start + self.seq_len + 1].long()
        return (window, self.document_ids(i)) if self.with_documents else window

    def document_ids(self, i: int) -> torch.Tensor:
        """(seq_len + 1,) int32: the document of each token of window i, 0 for the document
        the window starts in, +1 at every boundary."""
        start = (i % self.windows) * self.seq_len
        positions = np.arange(start, start + self.seq_len + 1)
        docs = np.searchsorted(self.doc_starts, positions, side="right") - 1
        return torch.from_numpy((docs - docs[0]).astype(np.int32))
