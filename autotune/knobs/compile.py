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

from autotune.config import TrainConfig
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
        _compile_module(model, options)
        return model
    if scope == "blocks+head":
        check_head_found(model)  # before anything is compiled: all or nothing
    for block in find_blocks(model, block_path):
        _compile_module(block, options)
    if scope == "blocks+head" and not head_is_compiled(model):
        head = torch.compile(model.head_loss, **options)
        setattr(head, _HEAD_MARK, True)
        # An instance attribute: forward's self.head_loss finds it.
        model.head_loss = _FloatsConstantUntilTrained(model, "head_loss", head) if dynamic else head
    return model


def _compile_module(module: nn.Module, options: dict[str, Any]) -> None:
    module.compile(**options)
    if options["dynamic"]:
        module._compiled_call_impl = _FloatsConstantUntilTrained(
            module, "_compiled_call_impl", module._compiled_call_impl
        )


class _FloatsConstantUntilTrained:
    """A compiled callable whose calls, until the first one with gradients on, compile with
    Python floats kept constant; then it puts the compiled callable back in its place.

    Why: `dynamic=True` makes every Python float dynamo meets a graph input, module
    attributes like LayerNorm's `eps` too. `layer_norm` needs a real float, so dynamo traces
    the whole graph, finds that out in a later pass, and traces it again with the float
    specialized: the second trace is the graph it keeps either way. Keeping floats constant
    from the start (`torch._dynamo.config.specialize_float`, torch's own switch) skips the
    first trace: 7.5 s -> 3.2 s of compile for gpt2-tiny's padded bf16 blocks on a CPU. Only
    while compiling: a float that does vary between calls (none in a transformer block) would
    be a recompile, and a process's other compiled code (an optimizer step with its learning
    rate) is left as torch would have it. Calls without gradients (evaluation, the label
    probe) keep the wrapper; the first training step, which compiles the forward, removes it,
    so training steps pay nothing for it."""

    def __init__(self, owner: Any, attribute: str, compiled: Any) -> None:
        self._owner, self._attribute, self._compiled = owner, attribute, compiled

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with torch._dynamo.config.patch(specialize_float=True):
            result = self._compiled(*args, **kwargs)
        if torch.is_grad_enabled():
            setattr(self._owner, self._attribute, self._compiled)
        return result

    def __getattr__(self, name: str) -> Any:  # the compiled callable's attributes (marks)
        if name in ("_owner", "_attribute", "_compiled"):  # not set yet (copy, pickle)
            raise AttributeError(name)
        return getattr(self._compiled, name)


def is_compiled(module: nn.Module) -> bool:
    """Whether `nn.Module.compile` was applied to this module itself."""
    return getattr(module, "_compiled_call_impl", None) is not None


def head_is_compiled(model: nn.Module) -> bool:
    return getattr(model.__dict__.get("head_loss"), _HEAD_MARK, False)


def apply_compile_knob(model: nn.Module, cfg: TrainConfig, where: Any) -> nn.Module:
    """The model stage's hook for `compile_mode` and `compile_scope`: over what checkpointing
    made (dynamic shapes for padded batches)."""
    return apply_compile(
        model, cfg.compile_mode, where.block_path, scope=cfg.compile_scope, dynamic=compile_dynamic(cfg.batching)
    )
