"""The model-side knobs applied in their one documented order (see the package docstring):
each knob of the registry's model stage (`registry.MODEL_STAGE`) through its `apply` hook."""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn as nn

from autotune import registry
from autotune.config import TrainConfig
from autotune.knobs.support import check_model_supported
from autotune.model.hf import is_hf_model, turn_off_kv_cache


@dataclass(frozen=True)
class Where:
    """What an apply hook may need besides the model and the configuration."""

    block_path: str | None  # where the transformer blocks are (None: found by their usual names)
    device_kind: str  # "cpu" or "cuda": where the model's parameters are
    world_size: int = 1  # the ranks the caller expects to train together (`knobs.parallel` checks the group's)


def apply_model_knobs(
    model: nn.Module, cfg: TrainConfig, block_path: str | None = None, *, world_size: int = 1
) -> nn.Module:
    """What the model cannot take fails first, whole; then training set-up, then each knob of
    the model stage in the registry's order: the allocator, the loss, checkpointing, compile,
    then the DDP wrap or FSDP2 sharding over `world_size` ranks (the model returned is the one
    to train: DDP's wrapper). Use the model returned."""
    check_model_supported(model, cfg)
    prepare_for_training(model)
    where = Where(block_path, _device_kind(model), world_size)
    for name in registry.MODEL_STAGE:
        model = registry.resolve(registry.knob(name).apply)(model, cfg, where)
    return model


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
