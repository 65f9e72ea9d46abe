"""The model-side knobs applied in their one documented order (see the package docstring)."""

from __future__ import annotations

import torch.nn as nn

from autotune.config import TrainConfig
from autotune.knobs.checkpoint import apply_activation_checkpointing
from autotune.knobs.compile import apply_compile, compile_dynamic


def apply_model_knobs(model: nn.Module, cfg: TrainConfig, block_path: str | None = None) -> nn.Module:
    """Checkpointing, then compile (dynamic shapes for padded batches): the one documented order."""
    apply_activation_checkpointing(model, cfg.checkpoint_layers, block_path, will_compile=cfg.compile_mode != "none")
    return apply_compile(model, cfg.compile_mode, block_path, dynamic=compile_dynamic(cfg.batching))
