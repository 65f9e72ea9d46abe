"""The model-side knobs applied in their one documented order (see the package docstring)."""

from __future__ import annotations

import torch.nn as nn

from autotune.config import TrainConfig
from autotune.knobs.allocator import apply_allocator_settings
from autotune.knobs.checkpoint import apply_activation_checkpointing
from autotune.knobs.compile import apply_compile, compile_dynamic
from autotune.knobs.loss import apply_loss_impl
from autotune.knobs.support import check_model_supported
from autotune.model.hf import is_hf_model, turn_off_kv_cache


def apply_model_knobs(model: nn.Module, cfg: TrainConfig, block_path: str | None = None) -> nn.Module:
    """What the model cannot take fails first, whole; then training set-up, the loss,
    checkpointing, then compile (dynamic shapes for padded batches): the one documented order."""
    check_model_supported(model, cfg)
    prepare_for_training(model)
    apply_allocator_settings(cfg, _device_kind(model))
    apply_loss_impl(model, cfg.loss_impl, cfg.token_budget)
    apply_activation_checkpointing(model, cfg.checkpoint_layers, block_path, will_compile=cfg.compile_mode != "none")
    return apply_compile(
        model, cfg.compile_mode, block_path, scope=cfg.compile_scope, dynamic=compile_dynamic(cfg.batching)
    )


def prepare_for_training(model: nn.Module) -> nn.Module:
    """What a model needs before its blocks are wrapped: a Hugging Face model's KV cache off
    for every call that does not ask for it (`model.hf.turn_off_kv_cache` says why; with it
    on, compiled blocks fall back to eager and checkpointed ones fail in backward). Neither
    the config nor the state dict changes, so save_pretrained / from_pretrained still work."""
    if is_hf_model(model):
        turn_off_kv_cache(model)
    return model


def _device_kind(model: nn.Module) -> str:
    param = next(model.parameters(), None)
    return param.device.type if param is not None else "cpu"
