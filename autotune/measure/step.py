"""The training step every autotune loop runs (measure, verify, profile), the optimizer it
steps, and the data stream it reads."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.nn as nn

from autotune.config import TrainConfig
from autotune.errors import UsageError
from autotune.knobs.apply import OPTIMIZER_STAGE, training_context
from autotune.knobs.parallel import GradientSync
from autotune.model.contract import forward_loss

OPTIMIZER_REGION = "autotune:optimizer"  # profiler label of the optimizer step (see measure/profile.py)


class TrainStep:
    """One micro-step per call; an optimizer step every `accumulation_steps` of them.

    Each micro-step copies its batch to the device, runs forward under the config's precision
    and SDPA backend, and backward of its loss divided by `accumulation_steps`, so the
    gradients add up to the mean of the micro-batches' mean losses (the gradient of one big
    batch when the micro-batches hold equal real tokens, as packed and fixed ones do). The
    micro-step that completes a group also unscales, steps and zeroes (GradScaler: one
    `step`/`update` per optimizer step, as its accumulation recipe says). `pending` counts
    the micro-steps since the last optimizer step: 0 at a boundary. Over several ranks (DDP,
    FSDP2) only the micro-step that completes a group communicates its gradients
    (`knobs.parallel.GradientSync`): the others accumulate locally.

    Every autotune loop runs it (measure, verify, profile). The batch's labels are aligned
    (label t is the target of position t); how the model is called and its loss read is the
    model contract (`model.contract.forward_loss`: a Hugging Face model by keyword, scored on
    its logits, so its labels are never shifted twice). `annotate` labels the optimizer step
    OPTIMIZER_REGION for the profiler."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scaler: torch.amp.GradScaler,
        *,
        device: torch.device,
        device_kind: str,
        cfg: TrainConfig,
        annotate: bool = False,
        accumulation_steps: int = 1,
    ) -> None:
        if isinstance(accumulation_steps, bool) or not isinstance(accumulation_steps, int) or accumulation_steps < 1:
            raise UsageError(f"accumulation_steps must be an integer >= 1, got {accumulation_steps!r}")
        self.optimizer, self.scaler, self.cfg = optimizer, scaler, cfg
        self.device, self.device_kind = device, device_kind
        self.accumulation_steps = accumulation_steps
        self.pending = 0
        self.micro_steps = 0
        self.optimizer_steps = 0
        # Off when measuring: even an idle record_function costs a little.
        self._optimizer_region = (
            (lambda: torch.profiler.record_function(OPTIMIZER_REGION)) if annotate else contextlib.nullcontext
        )
        self._loss_of = forward_loss(model)  # decided once, not per step
        # Several ranks: gradients communicated on the last micro-batch of an optimizer step only.
        self._sync = GradientSync(model)

    def __call__(self, x: torch.Tensor, y: torch.Tensor, document_ids: torch.Tensor | None = None) -> torch.Tensor:
        """One micro-step on (x, y); returns its loss, unscaled."""
        # non_blocking pairs with pin_memory: from pinned memory the copy overlaps compute.
        x = x.to(self.device, non_blocking=True)
        y = y.to(self.device, non_blocking=True)
        # Packed batches under attention_mask=document carry each position's document.
        extra = {} if document_ids is None else {"document_ids": document_ids.to(self.device, non_blocking=True)}
        with self._sync(last=self.pending + 1 == self.accumulation_steps):
            with training_context(self.device_kind, self.cfg):
                loss = self._loss_of(x, y, **extra)
            scaled = loss if self.accumulation_steps == 1 else loss / self.accumulation_steps
            self.scaler.scale(scaled).backward()
        self.micro_steps += 1
        self.pending += 1
        if self.pending == self.accumulation_steps:
            with self._optimizer_region():
                self.scaler.step(self.optimizer)
                self.scaler.update()
                self.optimizer.zero_grad(set_to_none=True)
            self.pending = 0
            self.optimizer_steps += 1
        return loss


make_train_step = TrainStep  # the name the loops call it by


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW as in GPT-2 training, with the optimizer stage's keywords (`knobs.apply.OPTIMIZER_STAGE`);
    the fused kernel where this torch and device have one."""
    params = [p for p in model.parameters() if p.requires_grad]
    kwargs = {"lr": 3e-4, "weight_decay": 0.1}
    for hook in OPTIMIZER_STAGE:
        kwargs.update(hook(cfg))
    try:
        return torch.optim.AdamW(params, **{"fused": True, **kwargs})
    except (RuntimeError, TypeError):
        return torch.optim.AdamW(params, **kwargs)


class EndlessBatches:
    """Batches across epochs (each new epoch reshuffles; persistent workers survive it). The
    first epoch begins at once, so its DataLoader workers start, and load ahead, before anything
    is timed; `epochs` counts the epochs begun (each one starts non-persistent workers anew)."""

    def __init__(self, loader) -> None:
        self.loader = loader
        self.epochs = 0
        self._batches: Iterator | None = self._epoch()

    def _epoch(self) -> Iterator:
        self.epochs += 1
        return iter(self.loader)

    def __iter__(self) -> "EndlessBatches":
        return self

    def __next__(self) -> tuple[torch.Tensor, ...]:
        if self._batches is None:
            raise StopIteration
        try:
            return next(self._batches)
        except StopIteration:
            self._batches = self._epoch()
        try:
            return next(self._batches)
        except StopIteration:  # a whole new epoch yields nothing
            raise UsageError("the data yields no batch: the corpus is smaller than one step's token budget") from None

    def close(self) -> None:
        """Stop: the epoch's iterator is dropped, which shuts its workers down now."""
        self._batches = None


def endless_batches(loader) -> EndlessBatches:
    return EndlessBatches(loader)
