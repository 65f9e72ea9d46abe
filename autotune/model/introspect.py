"""What autotune needs to know of any model, ours or a user's: where its transformer blocks
are, and its vocabulary, context, depth and head shape (for data, batching and MFU)."""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn as nn

from autotune.errors import UsageError

# Where blocks live in common codebases, tried in this order.
BLOCK_PATHS = (
    "transformer.h",
    "model.layers",
    "layers",
    "blocks",
    "transformer.layers",
    "gpt_neox.layers",
    "model.decoder.layers",
    "h",
)


def find_blocks(model: nn.Module, block_path: str | None = None) -> nn.ModuleList:
    """The `nn.ModuleList` of transformer blocks, at `block_path` or a common location."""
    paths = (block_path,) if block_path else BLOCK_PATHS
    for path in paths:
        found = _get_path(model, path)
        if isinstance(found, nn.ModuleList) and len(found) > 0:
            return found
        if block_path:
            kind = type(found).__name__ if found is not None else "nothing"
            raise UsageError(f"block_path {block_path!r} names {kind}, expected a non-empty torch.nn.ModuleList")
    raise UsageError(
        f"cannot find the transformer blocks of {type(model).__name__}: looked for a ModuleList at "
        f"{', '.join(BLOCK_PATHS)}; name it with block_path='...'"
    )


def _get_path(root: nn.Module, path: str) -> object | None:
    node: object = root
    for part in path.split("."):
        node = getattr(node, part, None)
        if node is None:
            return None
    return node


def check_block_indices(layers: tuple[int, ...], n_blocks: int) -> None:
    beyond = [i for i in layers if i >= n_blocks]
    if beyond:
        raise UsageError(
            f"checkpoint_layers {list(layers)}: block {beyond[0]} does not exist, the model has "
            f"{n_blocks} blocks (0..{n_blocks - 1})"
        )


def non_embedding_params(model: nn.Module) -> int:
    """Parameters that cost 6 FLOPs per token: all but the position embedding. The token
    embedding is kept because, tied to the head, it is a real matmul (nanoGPT's count)."""
    total = sum(p.numel() for p in model.parameters())
    wpe = getattr(getattr(model, "transformer", None), "wpe", None)
    return total - (wpe.weight.numel() if isinstance(wpe, nn.Embedding) else 0)


@dataclass(frozen=True)
class ModelShape:
    """What the measurement needs to know of any model: for data, batching and MFU."""

    vocab_size: int
    context_length: int
    n_layer: int
    n_head: int | None
    head_dim: int | None


def model_shape(model: nn.Module, seq_len: int | None = None) -> ModelShape:
    """Read vocabulary, context and block structure from our GPT or a user's model
    (attributes `vocab_size` / `context_length`, or a Hugging Face-style `config`)."""
    config = getattr(model, "config", None)
    vocab = _first_attr((model, config), ("vocab_size",))
    context = _first_attr((model, config), ("context_length", "block_size", "n_positions", "max_position_embeddings"))
    if vocab is None:
        raise UsageError("the model must expose vocab_size (on itself or on model.config)")
    if context is None and seq_len is None:
        raise UsageError("the model does not say its context length: pass --seq-len")
    n_head = _first_attr((model, config), ("n_head", "num_attention_heads"))
    n_embd = _first_attr((model, config), ("n_embd", "hidden_size"))
    return ModelShape(
        vocab_size=int(vocab),
        context_length=int(seq_len or context),
        n_layer=len(find_blocks(model)),
        n_head=int(n_head) if n_head else None,
        head_dim=int(n_embd) // int(n_head) if n_head and n_embd else None,
    )


def _first_attr(objects, names):
    for obj in objects:
        if obj is None:
            continue
        for name in names:
            value = getattr(obj, name, None)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    return None
