"""Each stage's hooks (`registry.Stage`), plain functions listed in the order they run:

    model      (model, cfg, where) -> the model to train     MODEL_STAGE, run by apply_model_knobs
    optimizer  (cfg) -> AdamW keyword arguments              OPTIMIZER_STAGE, by measure.step.make_optimizer
    step       (device_kind, cfg) -> a context manager       STEP_STAGE, entered by training_context

The process stage's list is in `knobs.process` (torch-free: the tuner starts trials with it); a
loader knob's hook is its registry entry's `loader` mapping (`data.batching.build_dataloader`)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch.nn as nn

from autotune.config import TrainConfig
from autotune.knobs.allocator import apply_allocator_knob
from autotune.knobs.attention import apply_attention_knob
from autotune.knobs.checkpoint import apply_checkpoint_knob
from autotune.knobs.compile import apply_compile_knob
from autotune.knobs.loss import apply_loss_knob
from autotune.knobs.parallel import apply_parallel_knob
from autotune.knobs.precision import precision, sdpa_backend
from autotune.knobs.process import apply_threads_knob
from autotune.knobs.support import check_model_supported
from autotune.model.hf import is_hf_model, turn_off_kv_cache

MODEL_STAGE = (
    apply_allocator_knob,  # expandable_segments: before anything allocates
    apply_threads_knob,  # cpu_threads: the threads every step runs on
    apply_attention_knob,  # sdpa_backend: what its kernel assumes of the attention, before anything wraps it
    apply_loss_knob,  # loss_impl: the head's loss function, before compile traces it
    apply_checkpoint_knob,  # checkpoint_layers: before compile, so dynamo sees each checkpoint as one op
    apply_compile_knob,  # compile_mode at compile_scope, over what the others made (`knobs.compile`)
    # parallelism: the DDP wrap, or FSDP2's fully_shard per block then the root, torchtitan's order: compiled
    # blocks meet their FSDP2 hooks and DDP's buckets from outside, where dynamo's DDPOptimizer splits graphs
    apply_parallel_knob,
)
OPTIMIZER_STAGE: tuple[Callable[[TrainConfig], dict[str, Any]], ...] = ()
STEP_STAGE = (
    lambda device_kind, cfg: precision(device_kind, cfg.amp_dtype),  # amp_dtype's autocast (TF32: fp32_precision)
    lambda device_kind, cfg: sdpa_backend(cfg.sdpa_backend),
)


@dataclass(frozen=True)
class Where:
    """What a model hook may need besides the model and the configuration."""

    block_path: str | None  # where the transformer blocks are (None: found by their usual names)
    device_kind: str  # "cpu" or "cuda": where the model's parameters are
    world_size: int = 1  # the ranks the caller expects to train together (`knobs.parallel` checks the group's)


def apply_model_knobs(
    model: nn.Module, cfg: TrainConfig, block_path: str | None = None, *, world_size: int = 1
) -> nn.Module:
    """What the model cannot take fails first, whole; then training set-up, then MODEL_STAGE in
    its order, the last the DDP wrap or FSDP2 sharding over `world_size` ranks (the model
    returned is the one to train: DDP's wrapper). Use the model returned."""
    check_model_supported(model, cfg)
    prepare_for_training(model)
    where = Where(block_path, _device_kind(model), world_size)
    for hook in MODEL_STAGE:
        model = hook(model, cfg, where)
    return model


@contextlib.contextmanager
def training_context(device_kind: str, cfg: TrainConfig) -> Iterator[None]:
    """Everything a forward pass runs under, STEP_STAGE in its order: autocast to the AMP dtype,
    the forced SDPA backend. TF32 is not here: it is set for the whole step (`fp32_precision`)."""
    with contextlib.ExitStack() as stack:
        for hook in STEP_STAGE:
            stack.enter_context(hook(device_kind, cfg))
        yield


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
