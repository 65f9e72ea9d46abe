"""torch.compile, per transformer block (see the package docstring for why per block)."""

from __future__ import annotations

import torch.nn as nn

from autotune.model.introspect import find_blocks


def apply_compile(model: nn.Module, mode: str, block_path: str | None = None) -> nn.Module:
    """Compile each block in place (`nn.Module.compile`, so state_dict keys are unchanged)."""
    if mode == "none":
        return model
    for block in find_blocks(model, block_path):
        block.compile(mode=mode)
    return model


def is_compiled(block: nn.Module) -> bool:
    return getattr(block, "_compiled_call_impl", None) is not None
