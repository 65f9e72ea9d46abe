"""autotune.data.packing: packed windows are contiguous, unpadded, and reshuffled each epoch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from autotune.config import IGNORE_INDEX
from tests.helpers import BUDGET, SEQ, data_loader


def test_packed_windows_are_contiguous_and_unpadded(synthetic):
    dl = data_loader(synthetic, batching="packed")
    stream = dl.dataset.stream.long()
    seen = 0
    for input_ids, labels in dl:
        assert input_ids.shape == (BUDGET // SEQ, SEQ)
        assert (labels != IGNORE_INDEX).all()
        assert torch.equal(labels[:, :-1], input_ids[:, 1:])
        seen += 1
    assert seen == len(dl) > 0
    # Windows overlap by one token: window i is stream[i*SEQ : i*SEQ + SEQ + 1].
    window = dl.dataset[3]
    assert torch.equal(window, stream[3 * SEQ : 4 * SEQ + 1])
    # Documents appear whole and in order within the stream.
    first = synthetic[int(np.random.default_rng(0).permutation(len(synthetic))[0])]
    assert torch.equal(stream[: len(first)], first)


@pytest.mark.slow
def test_loader_epochs_differ_and_replay(synthetic):
    def epochs(dl):
        return [[input_ids[:, :4].clone() for input_ids, _ in dl] for _ in range(2)]

    first = epochs(data_loader(synthetic, batching="packed"))
    again = epochs(data_loader(synthetic, batching="packed"))
    assert len(first[0]) == len(again[0]) == len(first[1]) > 1  # epochs of several batches
    assert all(torch.equal(a, b) for a, b in zip(first[0], again[0]))
    assert not all(torch.equal(a, b) for a, b in zip(first[0], first[1]))
