"""The GPT-2 family (nanoGPT-style, random weights, nothing downloaded) and user models.

The model knows nothing about checkpointing, compile or AMP: `knobs.py` applies those from
the outside, on our models and on the user's alike, by finding the transformer blocks."""

from __future__ import annotations

import importlib
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from autotune.errors import UsageError

IGNORE_INDEX = -100  # label of a pad position: cross-entropy skips it


@dataclass(frozen=True)
class GPTConfig:
    block_size: int = 1024  # context length
    vocab_size: int = 50304  # GPT-2's 50257 padded to a multiple of 64: faster matmuls
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    bias: bool = True


# Named sizes in one place (the real ones match OpenAI's GPT-2 release).
MODEL_SIZES: dict[str, GPTConfig] = {
    "gpt2": GPTConfig(n_layer=12, n_head=12, n_embd=768),  # 124M
    "gpt2-medium": GPTConfig(n_layer=24, n_head=16, n_embd=1024),  # 350M
    "gpt2-large": GPTConfig(n_layer=36, n_head=20, n_embd=1280),  # 774M
    "gpt2-xl": GPTConfig(n_layer=48, n_head=25, n_embd=1600),  # 1558M
    # For CPUs and tests: 2 blocks, 64 wide, a byte-level vocabulary (256 bytes + EOT,
    # padded to 320), 128 tokens of context. Small enough to train on 2 cores.
    "gpt2-tiny": GPTConfig(block_size=128, vocab_size=320, n_layer=2, n_head=2, n_embd=64),
}


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.n_head = config.n_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        # (B, T, C) -> (B, nh, T, hs)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        # No mask: sequences are right-padded, so with causal attention no real token ever
        # attends to a pad, and pad targets are ignored by the loss. This keeps flash usable.
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                h=nn.ModuleList(Block(config) for _ in range(config.n_layer)),
                ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # tied head (GPT-2)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):  # GPT-2's scaled init of residual projections
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def context_length(self) -> int:
        return self.config.block_size

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids, labels: (B, T). Returns the mean loss over non-pad labels, or the
        logits (B, T, vocab) when no labels are given."""
        B, T = input_ids.shape
        pos = torch.arange(T, device=input_ids.device)
        x = self.transformer.wte(input_ids) + self.transformer.wpe(pos)  # (B, T, C)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))  # (B, T, vocab)
        if labels is None:
            return logits
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), labels.view(-1), ignore_index=IGNORE_INDEX)


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


def build_model(name: str) -> nn.Module:
    """`gpt2`, `gpt2-medium`, `gpt2-large`, `gpt2-xl`, `gpt2-tiny`, or `package.module:factory`."""
    if name in MODEL_SIZES:
        return GPT(MODEL_SIZES[name])
    if ":" in name:
        return _build_user_model(name)
    raise UsageError(
        f"unknown model {name!r}: expected one of {', '.join(MODEL_SIZES)} or package.module:factory"
    )


def check_model_name(name: str) -> None:
    """Validate a model name without building it (cheap: for the CLI and the tuner)."""
    if name in MODEL_SIZES:
        return
    if ":" in name:
        _load_factory(name)
        return
    raise UsageError(
        f"unknown model {name!r}: expected one of {', '.join(MODEL_SIZES)} or package.module:factory"
    )


def _load_factory(name: str):
    module_name, _, attr = name.partition(":")
    # Like `python -m`, let a factory in the working directory be found.
    cwd = str(Path.cwd())
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"model {name!r}: cannot import module {module_name!r} ({exc})") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise UsageError(f"model {name!r}: {module_name} has no callable {attr!r}")
    return factory


def _build_user_model(name: str) -> nn.Module:
    factory = _load_factory(name)
    model = factory()
    if not isinstance(model, nn.Module):
        raise UsageError(f"model {name!r}: the factory returned {type(model).__name__}, expected a torch.nn.Module")
    return model


def model_shape(model: nn.Module, seq_len: int | None = None) -> ModelShape:
    """Read vocabulary, context and block structure from our GPT or a user's model
    (attributes `vocab_size` / `context_length`, or a Hugging Face-style `config`)."""
    from autotune.knobs import find_blocks  # blocks are found in one place

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
