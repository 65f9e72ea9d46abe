"""The one set-up every loop that steps a configuration runs: the model with its knobs, the
optimizer and gradient scaler, the data and its DataLoader, and the training step (with the
run's gradient accumulation), then the warm-up over every batch shape. `measure` (the measuring
loop), `soak_loop` (verify --soak) and `profile` all start here, so what they step is the same."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import torch
import torch.nn as nn
from torch.utils.data import DataLoader

from autotune.config import RunSpec, TrainConfig
from autotune.data.batching import build_dataloader, carries_document_ids, distinct_batch_shapes
from autotune.data.datasets import default_min_tokens, make_dataset
from autotune.errors import UsageError
from autotune.knobs.apply import apply_model_knobs
from autotune.knobs.precision import grad_scaler
from autotune.measure.compile_events import CompileEvents
from autotune.measure.step import TrainStep, endless_batches, make_optimizer, make_train_step
from autotune.measure.warmup import WarmUp, warm_up
from autotune.model.introspect import ModelShape, model_shape, non_embedding_params
from autotune.model.load import build_model


@dataclass
class TrainingSetUp:
    """What a loop steps with. `batches` is endless (each epoch reshuffles); close it to stop the
    DataLoader's workers now rather than at garbage collection."""

    model: nn.Module
    shape: ModelShape
    n_params: int  # non-embedding parameters (MFU's N)
    loader: DataLoader
    batches: Iterator
    step: TrainStep
    accumulation: int  # micro-batches per optimizer step

    def warm_up(
        self,
        spec: RunSpec,
        *,
        sync: Callable[[], None],
        events: CompileEvents,
        agree: Callable[[bool], bool] | None = None,
    ) -> WarmUp:
        """One step on a batch of every distinct shape, pass after pass until nothing compiles,
        then `spec.warmup` steps on real data, ending at an optimizer-step boundary. `agree`:
        whether every rank's pass was quiet (`measure.ranks`), given this rank's."""
        return warm_up(
            self.step,
            self.batches,
            shapes=distinct_batch_shapes(self.loader),
            documents=carries_document_ids(self.loader),
            vocab_size=self.shape.vocab_size,
            data_steps=spec.warmup,
            sync=sync,
            events=events,
            seed=spec.seed,
            accumulation_steps=self.accumulation,
            agree=agree,
        )

    def close(self) -> None:
        self.batches.close()


# The most tokens of data made (synthetic) or indexed (.bin) for a run: 268M, a few MiB of
# document lengths (packed windows: 2M at a context of 128).
MAX_EPOCH_TOKENS = 1 << 28


def epoch_tokens(seq_len: int, token_budget: int, steps: int | None) -> int:
    """Tokens of data for an epoch of at least `steps` micro-steps (a step holds at most its
    budget of them, pads included), never less than the default corpus, at most MAX_EPOCH_TOKENS."""
    default = default_min_tokens(seq_len)
    return default if steps is None else min(MAX_EPOCH_TOKENS, max(default, token_budget * steps))


def set_up_training(
    spec: RunSpec,
    cfg: TrainConfig,
    *,
    device: torch.device,
    device_kind: str,
    model: nn.Module | None = None,
    annotate: bool = False,
    before_knobs: Callable[[], None] | None = None,
    data_steps: int | None = None,
    rank: int = 0,
) -> TrainingSetUp:
    """Build (or take) the model, move it to `device`, apply the knobs in their order, and make
    the optimizer, data and step. `annotate` labels the optimizer step for the profiler;
    `before_knobs` runs just before the knobs are applied (the profiler names compiled kernels);
    `data_steps`: micro-steps the data must hold in one epoch (at least; else its default size);
    `rank`: which rank of a launch this is: each reads the same corpus in its own order (its own
    shard of the batches, the same set of batch shapes)."""
    accumulation = spec.accumulation_steps(cfg)  # UnsupportedConfig before anything is built
    model = model if model is not None else build_model(spec.model)
    shape = model_shape(model, spec.seq_len)
    context = getattr(model, "context_length", None)
    if spec.seq_len and isinstance(context, int) and spec.seq_len > context:
        raise UsageError(f"--seq-len {spec.seq_len} is longer than the model's context {context}")
    n_params = non_embedding_params(model)
    model.to(device).train()
    if before_knobs is not None:
        before_knobs()
    model = apply_model_knobs(model, cfg, world_size=spec.nproc_per_node)  # DDP wraps: train what comes back
    optimizer = make_optimizer(model, cfg)
    scaler = grad_scaler(device_kind, cfg.amp_dtype)
    dataset = make_dataset(
        spec.data,
        vocab_size=shape.vocab_size,
        seq_len=shape.context_length,
        seed=spec.seed,
        min_tokens=epoch_tokens(shape.context_length, cfg.token_budget, data_steps),
    )
    loader = build_dataloader(dataset, cfg, seq_len=shape.context_length, seed=spec.seed + rank)
    step = make_train_step(
        model,
        optimizer,
        scaler,
        device=device,
        device_kind=device_kind,
        cfg=cfg,
        annotate=annotate,
        accumulation_steps=accumulation,
    )
    return TrainingSetUp(model, shape, n_params, loader, endless_batches(loader), step, accumulation)
