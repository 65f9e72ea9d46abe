"""The GPT-2 family: nanoGPT-style, random weights, nothing downloaded.

The model knows nothing about checkpointing, compile or AMP: `autotune.knobs` applies those
from the outside, on our models and on the user's alike, by finding the transformer blocks.
Two seams let knobs reach inside: `head_loss` (the final norm, lm_head and the loss, from
the last hidden states: what compile_scope=blocks+head compiles) and `linear_cross_entropy`
(how that loss is computed: what loss_impl swaps). `document_ids` in forward makes attention
stop at document boundaries (attention_mask=document, packed batches). `forward_cached` is the
generation path: a forward over a KV cache (`model.kv_cache`; the decode loop is `model.decode`)."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from autotune.model.attention import document_causal_mask, flex_attention
from autotune.model.kv_cache import CachedCall
from autotune.model.loss import LinearCrossEntropy, standard_linear_cross_entropy
from autotune.model.sizes import GPTConfig


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.n_head = config.n_head

    def forward(
        self, x: torch.Tensor, block_mask=None, cached: CachedCall | None = None, layer: int = 0
    ) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        # (B, T, C) -> (B, nh, T, hs)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if cached is not None:  # generation: through the KV cache (`model.kv_cache`)
            y = cached.attend(layer, q, k, v)
        elif block_mask is None:
            # No mask: sequences are right-padded, so with causal attention no real token ever
            # attends to a pad, and pad targets are ignored by the loss. This keeps flash usable.
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)
        else:  # packed documents: causal within each document only
            y = flex_attention(q, k, v, block_mask)  # (B, nh, T, hs)
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

    def forward(
        self, x: torch.Tensor, block_mask=None, cached: CachedCall | None = None, layer: int = 0
    ) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), block_mask, cached, layer)
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
        # How head_loss turns the final hidden states into the loss (a function, not a
        # module: no state-dict entry). autotune.knobs.loss sets it for loss_impl.
        self.linear_cross_entropy: LinearCrossEntropy = standard_linear_cross_entropy
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

    def forward(
        self,
        input_ids: torch.Tensor,
        labels: torch.Tensor | None = None,
        document_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """input_ids, labels: (B, T). Returns the mean loss over non-pad labels, or the
        logits (B, T, vocab) when no labels are given. document_ids (B, T), optional: the
        document of each position in a packed window; attention then stays inside it."""
        x = self.hidden_states(input_ids, document_ids)
        if labels is None:
            return self.lm_head(self.transformer.ln_f(x))  # (B, T, vocab)
        return self.head_loss(x, labels)

    def hidden_states(self, input_ids: torch.Tensor, document_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Embeddings and the blocks: (B, T) ids -> (B, T, C) before the final norm."""
        B, T = input_ids.shape
        pos = torch.arange(T, device=input_ids.device)
        x = self.transformer.wte(input_ids) + self.transformer.wpe(pos)  # (B, T, C)
        block_mask = None if document_ids is None else document_causal_mask(document_ids)
        for block in self.transformer.h:
            x = block(x) if block_mask is None else block(x, block_mask)
        return x

    def head_loss(self, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The head, from the last hidden states (B, T, C): final norm, lm_head and the mean
        cross-entropy over non-pad labels. The one place the loss is computed."""
        return self.linear_cross_entropy(self.transformer.ln_f(hidden), self.lm_head.weight, labels)

    def forward_cached(self, input_ids: torch.Tensor, positions: torch.Tensor, cached: CachedCall) -> torch.Tensor:
        """Generation's forward: input_ids and their positions (B, T) (left-padded prompts have
        per-row positions), keys and values through `cached`. Returns the logits of the last
        position only, (B, vocab): all a greedy step needs (gpt-fast's prefill does the same)."""
        x = self.transformer.wte(input_ids) + self.transformer.wpe(positions)
        for layer, block in enumerate(self.transformer.h):
            x = block(x, cached=cached, layer=layer)
        return self.lm_head(self.transformer.ln_f(x[:, -1]))
