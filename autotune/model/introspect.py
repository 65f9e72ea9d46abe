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
    """Parameters that cost 6 FLOPs per token: all but the lookups. The position embedding is
    a lookup; so is the token embedding when it has its own weights (Llama), but tied to the
    head (GPT-2) it is a real matmul and is kept (nanoGPT's count)."""
    total = sum(p.numel() for p in model.parameters())
    wpe = getattr(getattr(model, "transformer", None), "wpe", None)
    lookups = wpe.weight.numel() if isinstance(wpe, nn.Embedding) else 0
    return total - lookups - _untied_input_embedding(model)


def _untied_input_embedding(model: nn.Module) -> int:
    """Parameters of a token embedding not shared with the output head (Hugging Face models
    say which is which through get_input_embeddings / get_output_embeddings)."""
    get_in, get_out = getattr(model, "get_input_embeddings", None), getattr(model, "get_output_embeddings", None)
    if not callable(get_in) or not callable(get_out):
        return 0
    embedding, head = get_in(), get_out()
    weight = getattr(embedding, "weight", None)
    if not isinstance(weight, nn.Parameter) or weight is getattr(head, "weight", None):
        return 0
    return weight.numel()


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
    context = context_length_of(model)
    if vocab is None:
        raise UsageError("the model must expose vocab_size (on itself or on model.config)")
    if context is None and seq_len is None:
        raise UsageError("the model does not say its context length: pass --seq-len")
    if seq_len is not None and context is not None and seq_len > context:
        raise UsageError(f"--seq-len {seq_len} is longer than the model's context {context}")
    n_head = _first_attr((model, config), ("n_head", "num_attention_heads"))
    n_embd = _first_attr((model, config), ("n_embd", "hidden_size"))
    # Llama-style configs may say head_dim outright (it need not be width / heads).
    head_dim = _first_attr((config,), ("head_dim",)) or (int(n_embd) // int(n_head) if n_head and n_embd else None)
    return ModelShape(
        vocab_size=int(vocab),
        context_length=int(seq_len or context),
        n_layer=len(find_blocks(model)),
        n_head=int(n_head) if n_head else None,
        head_dim=head_dim,
    )


def context_length_of(model: nn.Module) -> int | None:
    """The longest input the model takes: `context_length`, `block_size`, `n_positions` or
    `max_position_embeddings`, on the model or its (Hugging Face-style) config; None if unsaid."""
    model = getattr(model, "_orig_mod", model)  # torch.compile(model) wraps it
    return _first_attr((model, getattr(model, "config", None)), _CONTEXT_NAMES)


_CONTEXT_NAMES = ("context_length", "block_size", "n_positions", "max_position_embeddings")


def _first_attr(objects, names):
    for obj in objects:
        if obj is None:
            continue
        for name in names:
            value = getattr(obj, name, None)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    return None


# --- attention dropout ---------------------------------------------------------------------------
# Where attention modules keep the dropout they pass to scaled_dot_product_attention: Hugging
# Face's GPT-2 (and GPT-NeoX) an nn.Dropout `attn_dropout` / `attention_dropout` whose p they pass,
# Llama-family models a float `attention_dropout`, nanoGPT a float `dropout` on its attention
# module (a float `dropout` elsewhere, or an nn.Dropout `dropout`, is the output's: not the kernel's).
_ATTENTION_DROPOUTS = ("attn_dropout", "attention_dropout")


@dataclass(frozen=True)
class AttentionDropout:
    """One attention module's dropout probability, where it is kept."""

    module: nn.Module
    attribute: str
    p: float

    def turn_off(self) -> None:
        value = getattr(self.module, self.attribute)
        if isinstance(value, nn.Dropout):
            value.p = 0.0
        else:
            setattr(self.module, self.attribute, 0.0)


def attention_dropouts(model: nn.Module) -> list[AttentionDropout]:
    """The non-zero attention dropouts of `model` (see above for where they are found)."""
    found = []
    for module in model.modules():
        names = _ATTENTION_DROPOUTS + (("dropout",) if _is_attention(module) else ())
        for name in names:
            value = getattr(module, name, None)
            if name == "dropout" and isinstance(value, nn.Module):
                continue
            p = value.p if isinstance(value, nn.Dropout) else value
            if isinstance(p, float) and p > 0:
                found.append(AttentionDropout(module, name, p))
    return found


def _is_attention(module: nn.Module) -> bool:
    name = type(module).__name__.lower()
    return "attention" in name or "attn" in name
