"""Packed windows keep their document boundaries (attention_mask=document), and the knob
is rejected where every row already holds one document (padded, fixed)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from autotune.config import TrainConfig
from autotune.data.batching import DocumentCollate, build_dataloader
from autotune.data.packing import PackedDataset
from autotune.errors import UsageError


class Documents:
    """Document i is `lengths[i]` copies of the token i + 1: a token names its document."""

    def __init__(self, lengths):
        self.lengths = np.asarray(lengths)

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):
        return torch.full((int(self.lengths[i]),), i + 1, dtype=torch.long)


def same_document(tokens: torch.Tensor) -> torch.Tensor:
    """Document ids from tokens that name their document, 0 for the window's first."""
    changes = torch.cat([torch.zeros(1, dtype=torch.long), (tokens[1:] != tokens[:-1]).long()])
    return changes.cumsum(0).to(torch.int32)


def test_document_ids_mark_every_boundary_of_a_window():
    data = Documents(np.random.default_rng(0).integers(2, 40, size=300))
    packed = PackedDataset(data, seq_len=32, seed=3, with_documents=True)
    assert len(packed) > 100
    for i in range(len(packed)):
        window, docs = packed[i]
        assert window.shape == docs.shape == (33,) and docs.dtype == torch.int32
        assert torch.equal(docs, same_document(window)), i
    # The stream is the documents, whole, in the seeded order: starts where tokens change.
    stream = packed.stream.long()
    changes = np.flatnonzero(np.diff(stream.numpy())) + 1
    assert np.array_equal(packed.doc_starts, np.concatenate(([0], changes)))


def test_without_documents_items_stay_token_windows():
    data = Documents([30] * 20)
    plain = PackedDataset(data, seq_len=16)
    assert isinstance(plain[0], torch.Tensor) and plain[0].shape == (17,)
    assert torch.equal(plain[3], PackedDataset(data, seq_len=16, with_documents=True)[3][0])


def test_collate_aligns_inputs_labels_and_documents():
    window = torch.tensor([5, 5, 5, 7, 7, 9])
    docs = same_document(window)
    x, y, d = DocumentCollate()([(window, docs), (window.flip(0), same_document(window.flip(0)))])
    assert torch.equal(x[0], window[:-1]) and torch.equal(y[0], window[1:])
    assert torch.equal(d[0], torch.tensor([0, 0, 0, 1, 1], dtype=torch.int32))  # the inputs' documents
    assert x.shape == y.shape == d.shape == (2, 5)


def test_dataloader_yields_document_ids_only_with_the_document_mask():
    data = Documents(np.random.default_rng(1).integers(2, 40, size=400))
    causal = TrainConfig(batching="packed", token_budget=256)
    (batch,) = [next(iter(build_dataloader(data, causal, seq_len=64)))]
    assert len(batch) == 2
    x, y, docs = next(iter(build_dataloader(data, causal.replace(attention_mask="document"), seq_len=64)))
    assert x.shape == y.shape == docs.shape == (4, 64)
    for row in range(4):
        assert torch.equal(docs[row], same_document(x[row]))
    assert torch.equal(x, batch[0]) and torch.equal(y, batch[1])  # the same windows, plus their documents


@pytest.mark.parametrize("batching", ["padded", "fixed"])
def test_document_mask_rejected_where_rows_hold_one_document(batching):
    with pytest.raises(UsageError) as info:
        TrainConfig(batching=batching, attention_mask="document")
    assert str(info.value) == (
        f"attention_mask=document needs batching=packed: a {batching} row holds one document, "
        "so causal attention already stops at its boundary"
    )


def test_document_mask_leaves_the_sdpa_backend_at_auto():
    with pytest.raises(UsageError, match="runs FlexAttention, not scaled_dot_product_attention: sdpa_backend=flash"):
        TrainConfig(batching="packed", attention_mask="document", sdpa_backend="flash")
