"""Activation checkpointing of chosen transformer blocks: their activations are recomputed
in backward instead of stored, trading compute for memory."""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from autotune.config import TrainConfig
from autotune.knobs.precision import sdpa_backend
from autotune.model.introspect import check_block_indices, find_blocks

_CHECKPOINT_MARK = "__autotune_checkpointed__"


def apply_activation_checkpointing(
    model: nn.Module,
    layers: tuple[int, ...],
    block_path: str | None = None,
    *,
    will_compile: bool = False,
    sdpa_backend: str = "auto",
) -> nn.Module:
    """Recompute the chosen blocks' activations in backward instead of storing them.

    sdpa_backend: the recipe's forced attention kernel ("auto": none), entered inside each
    checkpointed block so that its forward and its recomputation run the same kernel.

    The block's `forward` is replaced on the instance, not wrapped in a new module, so the
    model's state_dict keys do not change and a user's checkpoint still loads."""
    if not layers:
        return model
    blocks = find_blocks(model, block_path)
    check_block_indices(layers, len(blocks))
    for index in layers:
        block = blocks[index]
        if not is_checkpointed(block):
            forward = _under_sdpa_backend(block.forward, sdpa_backend)
            block.forward = _checkpointed(forward, keep_sdpa_choice=not will_compile)
    return model


def _checkpointed(forward: Callable[..., torch.Tensor], keep_sdpa_choice: bool) -> Callable[..., torch.Tensor]:
    @functools.wraps(forward)
    def run(*args, **kwargs):
        # Non-reentrant: works with kwargs, inputs that need no grad, and torch.compile.
        # The recomputation runs in backward, usually outside the forced-SDPA context; in
        # eager it must pick the same attention kernel as the forward did, or the recomputed
        # tensors differ and checkpoint raises. Compiled blocks bake the kernel into the graph,
        # and so does a whole-model torch.compile over these blocks (Trainer's torch_compile),
        # whose tracer takes no context_fn: then the plain checkpoint.
        if keep_sdpa_choice and not torch.compiler.is_compiling():
            flags = _sdpa_flags()
            return checkpoint(
                forward,
                *args,
                use_reentrant=False,
                context_fn=lambda: (contextlib.nullcontext(), _sdpa_flags_set(flags)),
                **kwargs,
            )
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    setattr(run, _CHECKPOINT_MARK, True)
    return run


def _under_sdpa_backend(forward: Callable[..., torch.Tensor], backend: str) -> Callable[..., torch.Tensor]:
    """`forward` run inside the forced SDPA backend's context, the recomputation included.

    Why inside the checkpointed function and not only around the step: the recomputation runs
    in backward, outside the step's `sdpa_kernel`. Where dynamo traces the checkpoint as one
    higher-order op the kernel is baked into its graph, but a graph break inside the block (a
    Hugging Face Llama's attention sets a context variable of the `kernels` hub, a side effect
    dynamo refuses inside a checkpoint) makes dynamo run the checkpoint eagerly around
    compiled pieces: the forward's pieces then ran under the forced kernel, the recomputation's
    under the default one, which picks another kernel whose saved tensors have other shapes
    (math saves (B*H, T, T) scores, flash (B, H, T, D) outputs) and checkpoint raises
    CheckpointError. torch's message blames dynamic shapes (pytorch#166926); the kernel is the
    cause here. Dynamo traces `sdpa_kernel` inside the op, so a traced block keeps its graph."""
    if backend == "auto":
        return forward

    @functools.wraps(forward)
    def run(*args, **kwargs):
        with sdpa_backend(backend):
            return forward(*args, **kwargs)

    return run


_SDP_FLAGS = ("flash_sdp", "mem_efficient_sdp", "math_sdp", "cudnn_sdp")


def _sdpa_flags() -> tuple[bool, ...]:
    """Which SDPA backends are enabled now (sdpa_kernel sets these process-wide flags)."""
    return tuple(getattr(torch.backends.cuda, f"{name}_enabled")() for name in _SDP_FLAGS)


@contextlib.contextmanager
def _sdpa_flags_set(flags: tuple[bool, ...]) -> Iterator[None]:
    saved = _sdpa_flags()
    for name, on in zip(_SDP_FLAGS, flags):
        getattr(torch.backends.cuda, f"enable_{name}")(on)
    try:
        yield
    finally:
        for name, on in zip(_SDP_FLAGS, saved):
            getattr(torch.backends.cuda, f"enable_{name}")(on)


def is_checkpointed(block: nn.Module) -> bool:
    return getattr(block.__dict__.get("forward"), _CHECKPOINT_MARK, False)


def apply_checkpoint_knob(model: nn.Module, cfg: TrainConfig, where: Any) -> nn.Module:
    """The model stage's hook for `checkpoint_layers`: after the loss, before compile."""
    return apply_activation_checkpointing(
        model,
        cfg.checkpoint_layers,
        where.block_path,
        will_compile=cfg.compile_mode != "none",
        sdpa_backend=cfg.sdpa_backend,
    )
