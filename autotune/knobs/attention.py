"""What a forced SDPA backend (knob `sdpa_backend`) assumes of the model, made so before the
other knobs wrap it, in trials and in `Recipe.apply_to_model` alike (so a search measures the
model a recipe will train):

- the attention runs through PyTorch's scaled_dot_product_attention, where `sdpa_kernel`
  takes effect. A Hugging Face model loaded with `attn_implementation="eager"` is switched to
  "sdpa" (the same maths, one warning); one that runs another kernel (flash_attention_2, flex)
  is refused in one line: the recipe's backend would silently not apply.
- on a CPU, the flash kernel runs no attention dropout (torch's CPU flash has none; CUDA's
  has): with any, the first training step fails with "No available kernel". Hugging Face's
  GPT-2 keeps the released 0.1. The recipe was measured without attention dropout (autotune's
  GPT has none), so the model's is turned off, said in one warning with the way to keep it (a
  recipe with sdpa_backend=auto). Residual and embedding dropout are no kernel's business and
  stay. The config is untouched: a saved model reloads as it was configured.

The rule chosen over measuring "the model as the user will train it" in the search: a recipe
is applied to models the search never saw (the README loop, examples/train_gpt2.py), so the
recipe must carry its assumptions to the model; the search applies the same hook, so the two
never differ."""

from __future__ import annotations

import warnings
from typing import Any

import torch.nn as nn

from autotune.config import TrainConfig
from autotune.errors import RecipeModelWarning, UnsupportedConfig
from autotune.model.hf import SDPA, attention_implementation, use_sdpa_attention
from autotune.model.introspect import attention_dropouts


def apply_attention_knob(model: nn.Module, cfg: TrainConfig, where: Any) -> nn.Module:
    """The model stage's hook for `sdpa_backend`: after the allocator, before anything wraps
    the attention modules."""
    if cfg.sdpa_backend == "auto":
        return model
    _attention_through_sdpa(model, cfg.sdpa_backend)
    if cfg.sdpa_backend == "flash" and where.device_kind == "cpu":
        _no_attention_dropout(model)
    return model


def _attention_through_sdpa(model: nn.Module, backend: str) -> None:
    name = type(getattr(model, "_orig_mod", model)).__name__
    implementation = attention_implementation(model)
    if implementation in (None, SDPA):  # not a transformers model, or one already on SDPA
        return
    if implementation == "eager" and use_sdpa_attention(model):
        warnings.warn(
            f"{name}'s attention switched from eager to sdpa: the recipe forces the {backend} kernel of "
            "scaled_dot_product_attention, which eager attention never calls (the same maths)",
            RecipeModelWarning,
            stacklevel=5,  # the caller of apply_to_model
        )
        return
    raise UnsupportedConfig(
        "sdpa_backend",
        f"{backend} is a kernel of scaled_dot_product_attention, but {name} runs "
        f'attn_implementation="{implementation}", where it would not take effect: load the model with '
        'attn_implementation="sdpa", or use a recipe with sdpa_backend=auto',
    )


def _no_attention_dropout(model: nn.Module) -> None:
    found = attention_dropouts(model)
    if not found:
        return
    for dropout in found:
        dropout.turn_off()
    values = ", ".join(f"{p:g}" for p in sorted({d.p for d in found}))
    warnings.warn(
        f"attention dropout {values} of {type(getattr(model, '_orig_mod', model)).__name__} turned off: the recipe "
        "forces flash attention, whose CPU kernel runs no dropout (the recipe was measured without it); to keep "
        "it, use a recipe with sdpa_backend=auto",
        RecipeModelWarning,
        stacklevel=5,  # the caller of apply_to_model
    )
