"""The model contract: how autotune calls a model in a training step and reads its loss, in
one place (the measuring step, the check when a model is loaded, and `Recipe.dataloader`).

Two label conventions exist, and mixing them trains on the wrong target with no error at all:

    aligned    labels[t] is the target of position t: inputs x[:-1], labels x[1:]. autotune's
               GPT, nanoGPT, and models written to autotune's contract (docs/knobs.md, Your own model).
    unshifted  labels[t] == input_ids[t]; the model shifts inside its loss (the target of
               position t is labels[t + 1]). Every Hugging Face causal LM.

autotune's own batches are aligned. So a Hugging Face model is called with keywords and no
labels, `model(input_ids=x, use_cache=False)`, and its `.logits` are scored here against the
aligned labels: nothing is shifted twice. Any other model is called as
`model(x, labels=y)` when its forward has a `labels` parameter, else `model(x, y)` (or
`model(x)` when it takes one argument); it may return a scalar loss, an object with `.loss`,
a tuple holding a scalar loss (nanoGPT's `(logits, loss)`), or (B, T, vocab) logits. A model
that returns a loss is probed once when loaded (`label_convention_of`): one that shifts the
labels it is given would learn x[t + 2] from aligned labels, and is refused with the fix.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from autotune.config import IGNORE_INDEX
from autotune.errors import UsageError
from autotune.model.gpt import GPT
from autotune.model.hf import is_hf_model
from autotune.model.hf_loss import has_head_loss

ALIGNED = "aligned"
UNSHIFTED = "unshifted"
LABEL_CONVENTIONS = (ALIGNED, UNSHIFTED)

CONTRACT_HINT = (
    "the model contract: model(input_ids, labels) with (B, T) int64 tensors, labels aligned with the inputs "
    "(label t is the target of position t, -100 at pads), returning a scalar loss, an object with .loss, or "
    "(B, T, vocab) logits; a Hugging Face model is called as model(input_ids=..., use_cache=False) and scored "
    "on its .logits (docs/knobs.md: Your own model)"
)


# --- calling a model ---------------------------------------------------------------------------


def forward_loss(model: nn.Module) -> Callable[..., torch.Tensor]:
    """`loss = call(input_ids, aligned_labels, **extra)` for this model, decided once (not per
    step). `extra`: inputs a knob adds (document_ids, for autotune's GPT under a document mask).
    A model wrapped in DistributedDataParallel is called through the wrapper, as the model it
    wraps is called."""
    inner = _unwrapped(model)
    if is_hf_model(inner) and has_head_loss(inner):

        def call_hf_head_loss(x: torch.Tensor, y: torch.Tensor, **extra: torch.Tensor) -> torch.Tensor:
            # The loss through autotune's seam (loss_impl): from the hidden states, never the full
            # logits; shift_labels are HF's name for labels already aligned (nothing shifted again).
            return loss_from_output(model(input_ids=x, shift_labels=y, use_cache=False, **extra), y)

        return call_hf_head_loss
    if is_hf_model(inner):

        def call_hf(x: torch.Tensor, y: torch.Tensor, **extra: torch.Tensor) -> torch.Tensor:
            # No labels (the model would shift them) and no attention mask: with right padding
            # and causal attention no real token attends to a pad, and pad targets are -100, so
            # the mask changes nothing but rules out SDPA's is_causal kernels (flash).
            return loss_from_output(model(input_ids=x, use_cache=False, **extra), y)

        return call_hf
    call = _aligned_call(model, _forward_params(inner))
    return lambda x, y, **extra: loss_from_output(call(x, y, **extra), y)


def _unwrapped(model: nn.Module) -> nn.Module:
    """The model a DistributedDataParallel wrapper holds (its forward takes anything), else the model."""
    from torch.nn.parallel import DistributedDataParallel

    return model.module if isinstance(model, DistributedDataParallel) else model


def _aligned_call(model: nn.Module, params: dict[str, inspect.Parameter]) -> Callable[..., Any]:
    """model(x, labels=y), model(x, y) or model(x), by what its forward takes (`params`): a keyword
    keeps labels out of a parameter that happens to come second (attention_mask, past_key_values)."""
    if "labels" in params:
        return lambda x, y, **extra: model(x, labels=y, **extra)
    positional = [
        p for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
    ]
    if len(positional) < 2:
        return lambda x, y, **extra: model(x, **extra)
    return lambda x, y, **extra: model(x, y, **extra)


def batch_keys(model: nn.Module) -> tuple[str, str]:
    """The keyword names of the inputs and the labels in this model's forward, so that
    `model(**batch)` works: ("input_ids", "labels") for Hugging Face and autotune's GPT,
    ("idx", "targets") for nanoGPT."""
    if is_hf_model(model):
        return "input_ids", "labels"
    params = _forward_params(model)
    named = [p.name for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    inputs = named[0] if named else "input_ids"
    if "labels" in params:
        return inputs, "labels"
    return inputs, named[1] if len(named) > 1 else "labels"


def _forward_params(model: nn.Module) -> dict[str, inspect.Parameter]:
    try:
        return dict(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):  # a builtin or C-implemented forward: assume (x, y)
        return {"input_ids": _POSITIONAL("input_ids"), "labels": _POSITIONAL("labels")}


def _POSITIONAL(name: str) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def loss_from_output(output: Any, labels: torch.Tensor) -> torch.Tensor:
    """The loss in what a model returned: a scalar, `.loss`, a tuple holding a scalar, or
    logits ((B, T, vocab), bare or as `.logits`) scored against aligned `labels`."""
    loss = returned_loss(output)
    if loss is not None:
        return loss
    logits = _returned_logits(output)
    if logits is not None:
        return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)
    raise UsageError(f"the model returned {_describe(output)}; {CONTRACT_HINT}")


def returned_loss(output: Any) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        return output if output.dim() == 0 else None
    loss = getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.dim() == 0:
        return loss
    if isinstance(output, (tuple, list)):
        return next((o for o in output if isinstance(o, torch.Tensor) and o.dim() == 0), None)
    return None


def _returned_logits(output: Any) -> torch.Tensor | None:
    if isinstance(output, (tuple, list)) and output:
        output = output[0]
    logits = output if isinstance(output, torch.Tensor) else getattr(output, "logits", None)
    return logits if isinstance(logits, torch.Tensor) and logits.dim() == 3 else None


def _describe(output: Any) -> str:
    if isinstance(output, torch.Tensor):
        return f"a tensor of shape {tuple(output.shape)}"
    return type(output).__name__


# --- which labels a model expects ------------------------------------------------------------------


def label_convention_of(model: nn.Module) -> str:
    """UNSHIFTED for a model that shifts labels inside its loss, else ALIGNED.

    A Hugging Face model shifts by definition. Any other model that returns a loss is asked:
    given labels with a target at position 0 only, an aligned model scores it (a positive
    cross-entropy), while a model that shifts drops it (the label at 0 would be the target of
    position -1) and has nothing to score: NaN, or 0. A second call with targets everywhere
    tells that apart from a model that returns NaN anyway. The probe is 1 x 8 tokens, without
    gradients, in eval mode (no dropout), eager where blocks are compiled, the RNG state
    restored: it changes nothing."""
    if is_hf_model(model):
        return UNSHIFTED

    if isinstance(model, GPT):
        return ALIGNED
    first, everywhere = _probe_losses(model)
    if first is None:  # returns logits: autotune scores them against aligned labels itself
        return ALIGNED
    if everywhere is not None and _scored(everywhere) and not _scored(first):
        return UNSHIFTED
    return ALIGNED


def check_label_alignment(model: nn.Module, name: str) -> None:
    """Refuse a model whose loss shifts the aligned labels autotune gives it (a wrapper that
    returns a Hugging Face model's .loss, say): it would be measured, and trained, on x[t + 2]."""
    if is_hf_model(model) or label_convention_of(model) == ALIGNED:
        return
    raise UsageError(
        f"model {name!r} shifts the labels it is given (its loss ignores a target at position 0), "
        "so autotune's aligned labels would be shifted twice and train it on x[t + 2]: return the "
        "transformers model itself from the factory (autotune calls it with keywords and scores its .logits), "
        "or return logits instead of a loss"
    )


def _probe_losses(model: nn.Module) -> tuple[float | None, float | None]:
    """(loss with a target at position 0 only, loss with targets everywhere); (None, None)
    when the model returns logits rather than a loss."""
    param = next(model.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    vocab = _vocab_size(model)
    x = (torch.arange(1, 9, device=device) * 37 % vocab).unsqueeze(0)  # (1, 8), valid ids
    at_first = torch.full_like(x, IGNORE_INDEX)
    at_first[0, 0] = x[0, 1]
    everywhere = torch.roll(x, -1, dims=1)
    call = _aligned_call(model, _forward_params(model))
    was_training = model.training
    library_log = logging.getLogger("transformers")  # a wrapped HF model's first-loss notice is not ours to print
    saved_level = library_log.level
    library_log.setLevel(logging.ERROR)
    try:
        with (
            torch.random.fork_rng(devices=[device] if device.type == "cuda" else []),
            torch.no_grad(),
            _eager(),
        ):
            model.eval()
            try:
                first = returned_loss(call(x, at_first))
                if first is None:
                    return None, None
                all_ = returned_loss(call(x, everywhere))
            except Exception as exc:  # the contract is the likely cause: say so, with the error
                raise UsageError(
                    f"calling the model on a (1, 8) batch failed with {type(exc).__name__}: "
                    f"{str(exc).splitlines()[0] if str(exc) else ''}; {CONTRACT_HINT}"
                ) from exc
    finally:
        model.train(was_training)
        library_log.setLevel(saved_level)
    return float(first), (float(all_) if all_ is not None else None)


def _eager() -> contextlib.AbstractContextManager:
    """Compiled blocks run eagerly for the probe: a (1, 8) no-grad call would otherwise compile
    graphs of its own (torch.compiler.set_stance, torch 2.6 and newer)."""
    set_stance = getattr(torch.compiler, "set_stance", None)
    return set_stance("force_eager") if set_stance is not None else contextlib.nullcontext()


def _scored(loss: float) -> bool:
    return loss == loss and loss > 0  # not NaN, and a cross-entropy over some target


def _vocab_size(model: nn.Module) -> int:
    for obj in (model, getattr(model, "config", None)):
        value = getattr(obj, "vocab_size", None)
        if isinstance(value, int) and value >= 2:
            return min(value, 256)
    return 2
