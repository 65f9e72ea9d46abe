"""A Hugging Face causal LM given autotune's `linear_cross_entropy` seam, so that `loss_impl`
applies to it as to autotune's GPT.

A transformers causal LM computes `logits = lm_head(last_hidden_state)` and then its loss from
the logits: the full (B, T, vocab) logits exist, in the compute dtype and again in fp32, which is
what `loss_impl=chunked` avoids. `install_head_loss` gives the model a `linear_cross_entropy`
attribute (autotune's seam, which `knobs.loss` sets) and a forward that, for a training call
with labels, runs the decoder (`model.base_model`) and computes the loss from its last hidden
states and `lm_head.weight` through that seam, with Hugging Face's conventions: labels
unshifted (shifted here, as `ForCausalLMLoss` does) or `shift_labels` already aligned, -100
ignored, and `num_items_in_batch` (Trainer's count of labels over the accumulated micro-batches)
dividing the summed loss as HF's own does. Such a call returns `.loss` and no `.logits`: not
holding them is the point. Every other call (no labels, no gradients: generation, evaluation)
is the model's own forward, unchanged.

Checked when installed, without changing anything on failure: the head is a bias-free linear
layer (`get_output_embeddings()`), and the model's logits are exactly that head applied to the
decoder's last hidden state (a model that scales or soft-caps its logits, Gemma 2 say, is
refused: the chunked loss would train it on other logits). The state dict does not change."""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from autotune.config import IGNORE_INDEX
from autotune.errors import UnsupportedConfig
from autotune.model.loss import standard_linear_cross_entropy

_NOT_DECODER = ("labels", "shift_labels", "num_items_in_batch", "logits_to_keep", "return_dict")


def has_head_loss(model: nn.Module) -> bool:
    """Whether `install_head_loss` gave this model (compiled whole or not) its seam."""
    model = getattr(model, "_orig_mod", model)
    return isinstance(model.__dict__.get("forward"), functools.partial) and callable(
        getattr(model, "linear_cross_entropy", None)
    )


def install_head_loss(model: nn.Module) -> nn.Module:
    """Give a transformers causal LM the `linear_cross_entropy` seam (see the module
    docstring), standard until `knobs.loss` sets it; UnsupportedConfig, with nothing changed,
    for a model whose logits are not its bias-free head over its decoder's last hidden state."""
    if has_head_loss(model):
        return model
    _check_head(model)
    model.linear_cross_entropy = standard_linear_cross_entropy
    # An instance attribute: nn.Module calls self.forward. A partial of a top-level function, so
    # the model still pickles and deep-copies with it; with the model's own signature, which
    # Trainer reads (the columns it keeps, whether it passes num_items_in_batch).
    forward = functools.partial(_forward_with_head_loss, model, inspect.signature(type(model).forward))
    forward.__signature__ = inspect.signature(type(model).forward.__get__(model))  # type: ignore[attr-defined]
    model.forward = forward
    return model


def _forward_with_head_loss(model: nn.Module, signature: inspect.Signature, *args: Any, **kwargs: Any) -> Any:
    bound = signature.bind(model, *args, **kwargs)
    named = {k: v for k, v in bound.arguments.items() if k != "self"}
    named.update(named.pop(_var_keyword(signature), None) or {})
    labels, shift_labels = named.get("labels"), named.get("shift_labels")
    if (labels is None and shift_labels is None) or not torch.is_grad_enabled():
        return type(model).forward(model, *args, **kwargs)  # generation, evaluation: the model's own
    outputs = model.base_model(**{k: v for k, v in named.items() if k not in _NOT_DECODER})
    if shift_labels is None:  # unshifted, as HF takes them: the target of position t is labels[t + 1]
        shift_labels = F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]
    head = model.get_output_embeddings()
    loss = model.linear_cross_entropy(outputs.last_hidden_state, head.weight, shift_labels)
    items = named.get("num_items_in_batch")
    if items is not None:  # HF's sum over the labels of the accumulated micro-batches
        loss = loss * (shift_labels != IGNORE_INDEX).sum() / items
    from transformers.modeling_outputs import CausalLMOutputWithPast

    extras = {k: getattr(outputs, k, None) for k in ("hidden_states", "attentions")}
    return CausalLMOutputWithPast(loss=loss, **extras)


def _var_keyword(signature: inspect.Signature) -> str | None:
    return next((p.name for p in signature.parameters.values() if p.kind is p.VAR_KEYWORD), None)


def _check_head(model: nn.Module) -> None:
    name = type(model).__name__
    head = model.get_output_embeddings() if callable(getattr(model, "get_output_embeddings", None)) else None
    if not isinstance(head, nn.Linear) or head.bias is not None:
        raise UnsupportedConfig(
            "loss_impl", f"chunked needs a bias-free linear head (lm_head); {name} has {type(head).__name__}"
        )
    param = next(model.parameters())
    x = (torch.arange(1, 9, device=param.device) * 37 % head.out_features).unsqueeze(0)  # (1, 8) valid ids
    was_training = model.training
    try:
        with torch.no_grad():
            model.eval()
            logits = type(model).forward(model, input_ids=x, use_cache=False).logits
            hidden = model.base_model(input_ids=x, use_cache=False).last_hidden_state
            same = torch.allclose(logits.float(), head(hidden).float(), rtol=1e-4, atol=1e-5)
    finally:
        model.train(was_training)
    if not same:
        raise UnsupportedConfig(
            "loss_impl",
            f"chunked computes the loss from lm_head over the last hidden state, but {name}'s logits are "
            "something else (a scale or soft-capping): use loss_impl=standard",
        )
