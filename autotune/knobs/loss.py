"""The loss implementation (knob `loss_impl`), set on the model's `linear_cross_entropy`
seam before compile traces it (see autotune/model/loss.py for both implementations; a
transformers causal LM gets the seam from autotune/model/hf_loss.py)."""

from __future__ import annotations

from typing import Any

import torch.nn as nn

from autotune.config import TrainConfig
from autotune.model.hf import is_hf_model
from autotune.model.hf_loss import install_head_loss
from autotune.model.loss import chunked, standard_linear_cross_entropy


def apply_loss_knob(model: nn.Module, cfg: TrainConfig, where: Any) -> nn.Module:
    """The model stage's hook for `loss_impl`: `standard` or `chunked` on a model with the seam; a
    transformers causal LM is given the seam for `chunked` (`model.hf_loss`: UnsupportedConfig,
    nothing changed, where its logits are not its head over its last hidden state); another model
    without one keeps its own loss under `standard` (check_model_supported rejects `chunked` there
    first). Chunked slices are sized for the token budget, the most a step holds, so their count
    is fixed for the run and a compiled head keeps one graph across batch shapes."""
    if cfg.loss_impl == "chunked" and is_hf_model(model):
        install_head_loss(model)
    if not callable(getattr(model, "linear_cross_entropy", None)):
        return model
    model.linear_cross_entropy = (
        standard_linear_cross_entropy if cfg.loss_impl == "standard" else chunked(max_tokens=cfg.token_budget)
    )
    return model
