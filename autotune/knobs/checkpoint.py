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
from autotune.model.introspect import check_block_indices, find_blocks

_CHECKPOINT_MARK = "__autotune_checkpointed__"


def apply_activation_checkpointing(
    model: nn.Module, layers: tuple[int, ...], block_path: str | None = None, *, will_compile: bool = False
) -> nn.Module:
    """Recompute the chosen blocks' activations in backward instead of storing them.

    The block's `forward` is replaced on the instance, not wrapped in a new module, so the
    model's state_dict keys do not change and a user's checkpoint still loads."""
    if not layers:
        return model
    blocks = find_blocks(model, block_path)
    check_block_indices(layers, len(blocks))
    for index in layers:
        block = blocks[index]
        if not is_checkpointed(block):
            block.forward = _checkpointed(block.forward, keep_sdpa_choice=not will_compile)
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
    """The registry's hook for `checkpoint_layers`: after the loss, before compile."""
    return apply_activation_checkpointing(
        model, cfg.checkpoint_layers, where.block_path, will_compile=cfg.compile_mode != "none"
    )
