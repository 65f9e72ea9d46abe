"""The model-side knobs applied in their one documented order (see the package docstring)."""

from __future__ import annotations

import torch.nn as nn

from autotune.config import TrainConfig
from autotune.knobs.allocator import apply_allocator_settings
from autotune.knobs.checkpoint import apply_activation_checkpointing
from autotune.knobs.compile import apply_compile
from autotune.knobs.loss import apply_loss_impl
from autotune.knobs.support import check_model_supported


def apply_model_knobs(model: nn.Module, cfg: TrainConfig, block_path: str | None = None) -> nn.Module:
    """What the model cannot take fails first, whole; then the loss, checkpointing, then
    compile: the one documented order."""
    check_model_supported(model, cfg)
    apply_allocator_settings(cfg, _device_kind(model))
    apply_loss_impl(model, cfg.loss_impl, cfg.token_budget)
    apply_activation_checkpointing(model, cfg.checkpoint_layers, block_path, will_compile=cfg.compile_mode != "none")
    return apply_compile(model, cfg.compile_mode, block_path, scope=cfg.compile_scope, dynamic=cfg.batching == "padded")


def _device_kind(model: nn.Module) -> str:
    param = next(model.parameters(), None)
    return param.device.type if param is not None else "cpu"
