"""autotune.data.batching: token budgets, padding, shapes, fixed batches, shuffling, and the
DataLoader knobs (workers, prefetch, pinning) reaching the loader."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from autotune.config import IGNORE_INDEX, TrainConfig
from autotune.data.batching import (
    PAD_TOKEN_ID,
    FixedBatchSampler,
    PadCollate,
    TokenBudgetBatchSampler,
    _greedy_batches,
    build_dataloader,
    default_bucket,
    padded_width,
    padding_fraction,
)
from autotune.data.datasets import make_dataset
from autotune.errors import UsageError
from tests.helpers import BUDGET, SEQ, data_loader


def check_alignment(input_ids: torch.Tensor, labels: torch.Tensor, items: list[torch.Tensor]) -> None:
    """Row r holds items[r]: inputs x[:-1] and labels x[1:], then pads in both exactly after."""
    for row, item in enumerate(items):
        size = len(item) - 1
        assert torch.equal(input_ids[row, :size], item[:-1])
        assert torch.equal(labels[row, :size], item[1:])
        assert (input_ids[row, size:] == PAD_TOKEN_ID).all()
        assert (labels[row, size:] == IGNORE_INDEX).all()


def test_padded_batches_respect_budget_and_buckets(synthetic):
    bucket = default_bucket(SEQ)
    widths = set()
    batches = 0
    for input_ids, labels in data_loader(synthetic, batching="padded"):
        batches += 1
        width = input_ids.shape[1]
        assert input_ids.numel() <= BUDGET
        assert width % bucket == 0 or width == SEQ
        assert labels.shape == input_ids.shape and input_ids.dtype == labels.dtype == torch.long
        widths.add(width)
    assert batches > 50
    # Few distinct shapes for torch.compile.
    assert (default_bucket(128), default_bucket(256), default_bucket(1024)) == (16, 64, 64)
    assert len(widths) <= SEQ // bucket


def test_padded_batches_fill_the_budget_for_their_width(synthetic):
    # Widest first, each batch but the last-cut one holds token_budget // width sequences.
    sampler = TokenBudgetBatchSampler(synthetic.lengths, BUDGET, SEQ, seed=3)
    collate = PadCollate(SEQ, default_bucket(SEQ))
    short = 0
    for batch in sampler:
        input_ids, _ = collate([synthetic[i] for i in batch])
        rows, width = input_ids.shape
        short += rows != BUDGET // width
    assert short <= 1


@pytest.mark.slow
def random_batches(lengths, token_budget: int, seq_len: int, seed: int = 0) -> list[list[int]]:
    """The comparison for length grouping: random order, the same budget rule."""
    widths = padded_width(np.asarray(lengths, dtype=np.int64) - 1, seq_len, default_bucket(seq_len))
    return _greedy_batches(np.random.default_rng(seed).permutation(len(widths)), widths, token_budget)


def test_grouping_pads_far_less_than_random_batches(synthetic):
    collate = PadCollate(SEQ, default_bucket(SEQ))
    grouped = padding_fraction(data_loader(synthetic, batching="padded"))
    shuffled = padding_fraction(
        collate([synthetic[i] for i in batch]) for batch in random_batches(synthetic.lengths, BUDGET, SEQ, seed=0)
    )
    print(f"\npadding at seq_len {SEQ}, budget {BUDGET}: length-grouped {grouped:.3f}, random {shuffled:.3f}")
    assert grouped < 0.5 * shuffled


def test_collate_pads_labels_exactly_where_inputs_are_padding():
    items = [torch.arange(1, 6), torch.arange(10, 30), torch.arange(40, 42)]
    input_ids, labels = PadCollate(seq_len=64, bucket=16)(items)
    assert input_ids.shape == (3, 32)  # longest input 19 -> bucket of 16 -> 32
    check_alignment(input_ids, labels, items)
    input_ids, labels = PadCollate(seq_len=64, bucket=16, pad_to_full=True)(items)
    assert input_ids.shape == (3, 64)
    check_alignment(input_ids, labels, items)


@pytest.mark.slow
def test_loader_batches_are_the_dataset_items(synthetic):
    """An epoch of the loader is the sampler's batches, every one (a zip over the first few
    passed with an empty or cut-short loader): row r of each holds its item r, no row more."""
    sampler_batches = TokenBudgetBatchSampler(synthetic.lengths, BUDGET, SEQ, seed=0).batches(0)
    loaded = list(data_loader(synthetic, batching="padded"))
    assert len(loaded) == len(sampler_batches) > 5
    for batch, (input_ids, labels) in zip(sampler_batches, loaded):
        assert input_ids.shape[0] == labels.shape[0] == len(batch)
        check_alignment(input_ids, labels, [synthetic[i] for i in batch])
    assert sorted(i for batch in sampler_batches for i in batch) == list(range(len(synthetic)))  # each item once


def test_budget_smaller_than_context_is_rejected(synthetic):
    with pytest.raises(UsageError, match="token_budget 100 is smaller than the context length 128"):
        data_loader(synthetic, token_budget=100)


def test_fixed_batches_are_full_width(synthetic):
    dl = data_loader(synthetic, batching="fixed")
    assert len(dl) == len(synthetic) // (BUDGET // SEQ) > 0
    shapes = {(tuple(input_ids.shape), tuple(labels.shape)) for input_ids, labels in dl}
    assert shapes == {((BUDGET // SEQ, SEQ), (BUDGET // SEQ, SEQ))}


def test_fixed_batching_needs_one_full_batch():
    tiny = make_dataset("synthetic", vocab_size=320, seq_len=SEQ, min_tokens=100)
    with pytest.raises(UsageError, match="fixed batching needs 32 sequences"):
        data_loader(tiny, batching="fixed")


@pytest.mark.parametrize(
    "make_sampler",
    [
        lambda lengths, seed: TokenBudgetBatchSampler(lengths, BUDGET, SEQ, seed),
        lambda lengths, seed: FixedBatchSampler(len(lengths), BUDGET // SEQ, seed),
    ],
    ids=["padded", "fixed"],
)
def test_epochs_differ_and_seeds_replay(synthetic, make_sampler):
    sampler = make_sampler(synthetic.lengths, 0)
    first, second = list(sampler), list(sampler)
    assert first != second
    replay = make_sampler(synthetic.lengths, 0)
    assert list(replay) == first and list(replay) == second
    assert list(make_sampler(synthetic.lengths, 1)) != first


class PidDataset:
    """Each item carries the pid of the process that made it."""

    def __init__(self, size: int) -> None:
        self.lengths = [3] * size

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((3,), os.getpid(), dtype=torch.long)


def worker_pids(dl) -> set[int]:
    return {int(pid) for input_ids, _ in dl for pid in input_ids[:, 0]}


@pytest.mark.parametrize("persistent", [True, False])
def test_workers_are_processes_and_persistence_keeps_them(persistent):
    # 64 items of width 16 at budget 64: 16 batches, spread over both workers.
    dl = build_dataloader(
        PidDataset(64),
        TrainConfig(num_workers=2, persistent_workers=persistent, token_budget=64),
        seq_len=16,
    )
    first, second = worker_pids(dl), worker_pids(dl)
    assert len(first) == 2 and os.getpid() not in first
    if persistent:
        assert first == second
    else:
        assert len(second) == 2 and not first & second


def test_prefetch_and_pin_memory_reach_the_loader(synthetic):
    dl = data_loader(synthetic, num_workers=2, prefetch_factor=5, pin_memory=True)
    assert (dl.num_workers, dl.prefetch_factor, dl.pin_memory, dl.persistent_workers) == (2, 5, True, False)
    dl = data_loader(synthetic)
    assert (dl.num_workers, dl.prefetch_factor, dl.pin_memory) == (0, None, False)


def test_user_collate_replaces_ours(synthetic):
    calls = []

    def collate(items):
        calls.append(items)
        return "mine"

    dl = build_dataloader(synthetic, TrainConfig(token_budget=BUDGET), seq_len=SEQ, collate_fn=collate)
    assert next(iter(dl)) == "mine"
    assert all(isinstance(item, torch.Tensor) and item.dim() == 1 for item in calls[0])
