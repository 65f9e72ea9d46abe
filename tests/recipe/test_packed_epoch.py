"""`recipe.dataloader`: an epoch covers the whole data set. The packed stream a measurement
uses is capped (PACKED_MAX_TOKENS: thousands of windows are enough to time a step); a training
epoch read only that many tokens, the same documents every epoch, and dropped the rows left over
after the last full batch."""

from __future__ import annotations

import numpy as np
import torch

from autotune.config import TrainConfig
from autotune.data.packing import PACKED_MAX_TOKENS
from autotune.recipe import Recipe

DOC_TOKENS = 4000


class Documents:
    """`count` documents of DOC_TOKENS tokens, document i made of token i + 1 only, so a batch
    says which documents it holds; `lengths` given, so nothing is read to plan batches."""

    def __init__(self, count: int) -> None:
        self.lengths = np.full(count, DOC_TOKENS)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> np.ndarray:
        return np.full(DOC_TOKENS, i + 1, dtype=np.int64)


def test_a_packed_epoch_covers_a_data_set_larger_than_the_measuring_cap():
    count = 1100  # 4,400,000 tokens: 1.05 times the cap
    assert count * DOC_TOKENS > PACKED_MAX_TOKENS
    recipe = Recipe(config=TrainConfig(batching="packed", token_budget=64 * 1024))
    loader = recipe.dataloader(Documents(count), labels="aligned", seq_len=DOC_TOKENS)
    for epoch in range(2):  # each epoch, not only the first
        seen = torch.zeros(count + 1, dtype=torch.bool)
        tokens = 0
        for batch in loader:
            seen[batch["input_ids"].flatten()] = True
            tokens += int((batch["labels"] != -100).sum())
        assert int(seen[1:].sum()) == count, f"epoch {epoch}: {int(seen[1:].sum())} of {count} documents"
        assert tokens == count * DOC_TOKENS - 1  # every token is a label, but the first (the remainder too)


def test_an_epoch_of_fixed_rows_trains_on_every_document():
    """The rows left over after the last full batch make a smaller one (a measurement drops them)."""
    recipe = Recipe(config=TrainConfig(batching="fixed", token_budget=8 * 64))
    loader = recipe.dataloader([[i + 1] * 50 for i in range(100)], labels="aligned", seq_len=64)
    assert [len(batch["input_ids"]) for batch in loader].count(4) == 1  # 100 = 12 x 8 + 4
    seen = torch.cat([batch["input_ids"].flatten() for batch in loader]).unique()
    assert seen[seen > 0].tolist() == list(range(1, 101))
