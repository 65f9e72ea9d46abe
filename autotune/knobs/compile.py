"""torch.compile, per transformer block (see the package docstring for why per block).

Shapes: `padded` batches come in one shape per (batch size, bucketed width), a dozen or
more per epoch. Left to itself, dynamo compiles the first shape static, recompiles with
the dimensions that changed marked dynamic, and recompiles again when a dimension it kept
static (the batch size) changes later: up to three compiles, the last one possibly in the
middle of training. Those blocks are compiled `dynamic=True` from the start: one graph for
every shape. `packed` and `fixed` batches have one shape, compiled static (the best kernels);
they keep torch's default (`dynamic=None`) rather than `False`, so a user's loader that does
vary its shapes gets one dynamic recompile, not one per shape until the recompile limit
silently drops the blocks back to eager."""

from __future__ import annotations

import torch.nn as nn

from autotune.model.introspect import find_blocks


def compile_dynamic(batching: str) -> bool | None:
    """`dynamic` for torch.compile under a batching mode: True where shapes vary (padded),
    else torch's default (static while the shape stays the same)."""
    return True if batching == "padded" else None


def apply_compile(
    model: nn.Module, mode: str, block_path: str | None = None, *, dynamic: bool | None = None
) -> nn.Module:
    """Compile each block in place (`nn.Module.compile`, so state_dict keys are unchanged)."""
    if mode == "none":
        return model
    for block in find_blocks(model, block_path):
        block.compile(mode=mode, dynamic=dynamic)
    return model


def is_compiled(block: nn.Module) -> bool:
    return getattr(block, "_compiled_call_impl", None) is not None
