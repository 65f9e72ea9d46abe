"""The training step every autotune loop runs (measure, verify, profile), the optimizer it
steps, and the data stream it reads."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch
import torch.nn as nn

from autotune.config import TrainConfig
from autotune.errors import UsageError
from autotune.knobs.precision import training_context
from autotune.model.contract import forward_loss, loss_from_output

OPTIMIZER_REGION = "autotune:optimizer"  # profiler label of the optimizer step (see measure/profile.py)


def make_train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    *,
    device: torch.device,
    device_kind: str,
    cfg: TrainConfig,
    annotate: bool = False,
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """One training step, as every autotune loop runs it (measure, verify, profile): copy the
    batch to the device, forward under the config's precision and SDPA backend, scaled
    backward, optimizer step. The batch's labels are aligned (label t is the target of
    position t); how the model is called and its loss read is the model contract
    (`model.contract.forward_loss`: a Hugging Face model by keyword, scored on its logits, so
    its labels are never shifted twice). `annotate` labels the optimizer step
    OPTIMIZER_REGION for the profiler; off when measuring, where even an idle
    record_function costs a little."""
    optimizer_region = (
        (lambda: torch.profiler.record_function(OPTIMIZER_REGION)) if annotate else contextlib.nullcontext
    )
    loss_of = forward_loss(model)  # decided once, not per step

    def step(x: torch.Tensor, y: torch.Tensor, document_ids: torch.Tensor | None = None) -> torch.Tensor:
        # non_blocking pairs with pin_memory: from pinned memory the copy overlaps compute.
        x = x.to(device, non_blocking=True)
        y = y.to(device, non_blocking=True)
        # Packed batches under attention_mask=document carry each position's document.
        extra = {} if document_ids is None else {"document_ids": document_ids.to(device, non_blocking=True)}
        with training_context(device_kind, cfg):
            loss = loss_of(x, y, **extra)
        scaler.scale(loss).backward()
        with optimizer_region():
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
        return loss

    return step


def make_optimizer(model: nn.Module, device: torch.device) -> torch.optim.Optimizer:
    """AdamW as in GPT-2 training; the fused kernel where this torch and device have one."""
    params = [p for p in model.parameters() if p.requires_grad]
    try:
        return torch.optim.AdamW(params, lr=3e-4, weight_decay=0.1, fused=True)
    except (RuntimeError, TypeError):
        return torch.optim.AdamW(params, lr=3e-4, weight_decay=0.1)


def model_loss(output: Any, labels: torch.Tensor) -> torch.Tensor:
    """The loss in a model's output, for aligned `labels`: a scalar loss, `.loss`, a tuple
    holding a scalar loss, or (B, T, vocab) logits (see `model.contract`)."""
    return loss_from_output(output, labels)


def endless_batches(loader) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Batches across epochs (each new epoch reshuffles; persistent workers survive it)."""
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            raise UsageError("the data yields no batch: the corpus is smaller than one step's token budget")
