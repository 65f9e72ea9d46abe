"""Models: the GPT-2 family (`gpt`), loading by name (`load`), and reading any model's shape
and blocks (`introspect`)."""

from __future__ import annotations

from autotune.model.gpt import GPT, MODEL_SIZES, GPTConfig
from autotune.model.introspect import ModelShape, find_blocks, model_shape, non_embedding_params
from autotune.model.load import build_model, check_model_name

__all__ = [
    "GPT",
    "MODEL_SIZES",
    "GPTConfig",
    "ModelShape",
    "build_model",
    "check_model_name",
    "find_blocks",
    "model_shape",
    "non_embedding_params",
]
