"""Training data: datasets (`datasets`), tokenizers (`tokenize`), packing (`packing`) and
the batches and DataLoader built from them (`batching`)."""

from __future__ import annotations

from autotune.data.batching import PadCollate, build_dataloader
from autotune.data.datasets import TokenDataset, make_dataset

__all__ = ["PadCollate", "TokenDataset", "build_dataloader", "make_dataset"]
