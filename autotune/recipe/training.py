"""The training side of a recipe: its DataLoader over a user's dataset, and the device kind
its autocast and scaler use. Imported by the Recipe methods that need torch, when called."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np
import torch

from autotune.config import TrainConfig
from autotune.data.batching import build_dataloader
from autotune.errors import RecipeEnvironmentWarning, UsageError

if TYPE_CHECKING:
    from torch.utils.data import DataLoader


def recipe_dataloader(
    cfg: TrainConfig,
    dataset: Any,
    *,
    collate_fn: Callable[[list[torch.Tensor]], Any] | None,
    seq_len: int | None,
    recorded_seq_len: int | None,
    seed: int,
) -> DataLoader:
    """See `Recipe.dataloader`; `recorded_seq_len` is the recipe's, used when `seq_len` is None."""
    lengths = item_lengths(dataset)
    if seq_len is None:
        seq_len = recorded_seq_len or (int(lengths.max()) - 1 if len(lengths) else None)
    check_lengths(lengths, seq_len)
    if cfg.pin_memory and not torch.cuda.is_available():
        warnings.warn(
            "recipe: pin_memory dropped, there is no CUDA device to copy to", RecipeEnvironmentWarning, stacklevel=3
        )
        cfg = cfg.replace(pin_memory=False)
    return build_dataloader(
        TokenSequences(dataset, np.asarray(lengths, dtype=np.int64)),
        cfg,
        seq_len=int(seq_len),
        seed=seed,
        collate_fn=collate_fn,
    )


class TokenSequences:
    """A user's dataset as autotune's loader reads it: items as 1-D int64 tensors, and
    `lengths` for planning batches. Top-level, holding only the dataset and an array, so
    DataLoader workers can pickle it (the user's dataset must be picklable too)."""

    def __init__(self, dataset: Any, lengths: np.ndarray) -> None:
        self.dataset = dataset
        self.lengths = lengths

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> torch.Tensor:
        item = torch.as_tensor(self.dataset[i], dtype=torch.long)
        if item.dim() != 1:
            raise UsageError(
                f"dataset item {i} has shape {tuple(item.shape)}; expected one sequence of token ids (1-D)"
            )
        return item


def item_lengths(dataset: Any) -> np.ndarray:
    if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
        raise UsageError(f"dataset: expected a map-style dataset (len() and [i]), got {type(dataset).__name__}")
    given: Sequence[int] | None = getattr(dataset, "lengths", None)
    if given is not None:
        lengths = np.asarray(given, dtype=np.int64)
        if lengths.shape != (len(dataset),):
            raise UsageError(f"dataset.lengths has {lengths.size} entries for {len(dataset)} items")
        return lengths
    # No lengths: one pass over the data (documented in Recipe.dataloader).
    return np.fromiter((len(dataset[i]) for i in range(len(dataset))), dtype=np.int64, count=len(dataset))


def check_lengths(lengths: np.ndarray, seq_len: int | None) -> None:
    if len(lengths) == 0:
        raise UsageError("dataset is empty")
    if seq_len is None or seq_len < 1:
        raise UsageError(f"seq_len must be a positive integer, got {seq_len!r}")
    short = np.flatnonzero(lengths < 2)
    if len(short):
        raise UsageError(
            f"dataset item {int(short[0])} has {int(lengths[short[0]])} tokens; each item needs at least 2 "
            "(inputs are x[:-1], labels x[1:])"
        )
    long = np.flatnonzero(lengths > seq_len + 1)
    if len(long):
        raise UsageError(
            f"dataset item {int(long[0])} has {int(lengths[long[0]])} tokens, more than seq_len + 1 = "
            f"{seq_len + 1}; cut documents into pieces of at most seq_len + 1 tokens"
        )


def device_kind(device_type: str | None) -> str:
    if device_type is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    return str(device_type).split(":", 1)[0]  # autocast takes "cuda", not "cuda:1"
