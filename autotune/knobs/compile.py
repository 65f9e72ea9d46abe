"""torch.compile at one of three scopes (knob `compile_scope`), always after checkpointing.

  blocks       each transformer block, in place. The blocks are identical, so one traced
               graph serves all of them and compile time does not grow with depth; the
               embedding, the head and the loss stay eager.
  blocks+head  the blocks as above, plus the model's head as one more region: `head_loss`
               (final norm, lm_head and the loss, from the last hidden states). The
               vocabulary-wide matmul, the softmax and its fp32 upcast then fuse instead of
               materializing fp32 logits. Needs a model with a `head_loss(hidden, labels)`
               method (autotune's GPT has one); on another model it is `unsupported`.
  model        the whole model as one graph, embedding to loss, as nanoGPT and
               modded-nanogpt compile it; compile time grows with depth.

The order with checkpointing, scope by scope: checkpointing first replaces the chosen
blocks' `forward` on the instance, then compile traces code that calls those forwards, so
dynamo meets each checkpoint inside the graph it traces (one higher-order op whose
recomputation it plans itself) rather than an eager recomputation around compiled code.
  blocks       a block's compiled call runs its (checkpointed) forward;
  blocks+head  the same, and the head is never checkpointed;
  model        the root's graph traces through every block's checkpointed forward.

State-dict keys never change: `nn.Module.compile` compiles in place (no OptimizedModule
wrapper, no `_orig_mod.` prefix), and the compiled head replaces a method on the instance.

Shapes: `padded` batches come in one shape per (batch size, bucketed width), a dozen or
more per epoch. Left to itself, dynamo compiles the first shape static, recompiles with
the dimensions that changed marked dynamic, and recompiles again when a dimension it kept
static (the batch size) changes later: up to three compiles, the last one possibly in the
middle of training. Those blocks are compiled `dynamic=True` from the start: one graph for
every shape. `packed` and `fixed` batches have one shape, compiled static (the best kernels);
they keep torch's default (`dynamic=None`) rather than `False`, so a user's loader that does
vary its shapes gets one dynamic recompile, not one per shape until the recompile limit
silently drops the blocks back to eager.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from autotune.knobs.support import check_head_found
from autotune.model.introspect import find_blocks

_HEAD_MARK = "__autotune_compiled_head__"


def compile_dynamic(batching: str) -> bool | None:
    """`dynamic` for torch.compile under a batching mode: True where shapes vary (padded),
    else torch's default (static while the shape stays the same)."""
    return True if batching == "padded" else None


def apply_compile(
    model: nn.Module,
    mode: str,
    block_path: str | None = None,
    *,
    scope: str = "blocks",
    dynamic: bool | None = None,
) -> nn.Module:
    """Compile `model` at `scope`, in place. dynamic: torch.compile's (None: automatic)."""
    if mode == "none":
        return model
    options: dict[str, Any] = {"mode": mode, "dynamic": dynamic}
    if scope == "model":
        model.compile(**options)
        return model
    if scope == "blocks+head":
        check_head_found(model)  # before anything is compiled: all or nothing
    for block in find_blocks(model, block_path):
        block.compile(**options)
    if scope == "blocks+head" and not head_is_compiled(model):
        head = torch.compile(model.head_loss, **options)
        setattr(head, _HEAD_MARK, True)
        model.head_loss = head  # an instance attribute: forward's self.head_loss finds it
    return model


def is_compiled(module: nn.Module) -> bool:
    """Whether `nn.Module.compile` was applied to this module itself."""
    return getattr(module, "_compiled_call_impl", None) is not None


def head_is_compiled(model: nn.Module) -> bool:
    return getattr(model.__dict__.get("head_loss"), _HEAD_MARK, False)
