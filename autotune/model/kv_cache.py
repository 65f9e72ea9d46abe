"""KV caches for autotune's GPT (knob `kv_cache`), and what one cached forward attends to.

    dynamic   each layer's keys and values grow by one position a token (`torch.cat`), as
              Hugging Face's DynamicCache does: nothing is allocated ahead, but every decode step
              has a new shape, so a compiled step recompiles (once, then it is dynamic) and
              CUDA graphs would record one graph per length.
    static    gpt-fast's: every layer's keys and values preallocated for the longest sequence
              (the longest padded prompt plus the new tokens), written in place at the step's
              position (`index_copy_`); a decode step attends over the whole buffer through a
              mask of the positions written so far. One shape for every step: compiled once,
              one CUDA graph. The buffers are marked static addresses, so a CUDA graph reads
              them where they are instead of copying them in at every replay.

Prompts are left-padded (`key_valid` says which positions are tokens): a real token never
attends to a pad. A pad position attends to itself alone (its row would otherwise be all
masked, and a softmax over nothing is NaN, which reaches real tokens through the values)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F


class StaticCache:
    """Keys and values of every layer, (B, heads, max_len, head_dim), preallocated."""

    kind = "static"

    def __init__(
        self,
        *,
        n_layer: int,
        batch: int,
        n_head: int,
        head_dim: int,
        max_len: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        shape = (batch, n_head, max_len, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layer)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layer)]
        self.key_valid = torch.zeros(batch, max_len, dtype=torch.bool, device=device)
        self.max_len = max_len
        if "torch._dynamo" in sys.modules:  # compiling (importing dynamo only to mark them costs seconds)
            for buffer in (*self.keys, *self.values, self.key_valid):
                torch._dynamo.mark_static_address(buffer)

    def start(self, prompt_valid: torch.Tensor) -> None:
        """A new generation: its prompts' valid positions, and every later position valid (the
        generated tokens). Written in place: the buffers keep their addresses."""
        width = prompt_valid.shape[1]
        self.key_valid[:, :width].copy_(prompt_valid)
        self.key_valid[:, width:].fill_(True)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, index: torch.Tensor) -> tuple[torch.Tensor, ...]:
        self.keys[layer].index_copy_(2, index, k)
        self.values[layer].index_copy_(2, index, v)
        return self.keys[layer], self.values[layer]

    def decode_mask(self, index: torch.Tensor) -> torch.Tensor:
        """(B, 1, 1, max_len): the tokens written up to `index` (this step's included)."""
        written = torch.arange(self.max_len, device=index.device) <= index
        return (self.key_valid & written)[:, None, None, :]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


class DynamicCache:
    """Keys and values of every layer, concatenated a position at a time."""

    kind = "dynamic"

    def __init__(self, *, n_layer: int) -> None:
        self.keys: list[torch.Tensor | None] = [None] * n_layer
        self.values: list[torch.Tensor | None] = [None] * n_layer
        self.key_valid: torch.Tensor | None = None
        self.has_pads = False

    def start(self, prompt_valid: torch.Tensor) -> None:
        self.keys = [None] * len(self.keys)
        self.values = [None] * len(self.values)
        self.key_valid = prompt_valid
        self.has_pads = not bool(prompt_valid.all())  # on the host once a generation, not per token

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, index: torch.Tensor) -> tuple[torch.Tensor, ...]:
        old_k, old_v = self.keys[layer], self.values[layer]
        self.keys[layer] = k if old_k is None else torch.cat([old_k, k], dim=2)
        self.values[layer] = v if old_v is None else torch.cat([old_v, v], dim=2)
        return self.keys[layer], self.values[layer]

    def decode_mask(self, index: torch.Tensor) -> torch.Tensor | None:
        """None without pads (a single query attends to everything before it); else the valid
        positions, grown by the generated ones."""
        if not self.has_pads:
            return None
        assert self.key_valid is not None
        grown = self.keys[0].shape[2] + 1 - self.key_valid.shape[1]
        if grown > 0:
            ones = torch.ones(self.key_valid.shape[0], grown, dtype=torch.bool, device=self.key_valid.device)
            self.key_valid = torch.cat([self.key_valid, ones], dim=1)
        return self.key_valid[:, None, None, :]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values) if t is not None)


Cache = StaticCache | DynamicCache


def make_cache(kind: str, **shape: Any) -> Cache:
    """The cache `kv_cache` names; a static one of `shape` (StaticCache's arguments)."""
    return StaticCache(**shape) if kind == "static" else DynamicCache(n_layer=shape["n_layer"])


def prefill_mask(prompt_valid: torch.Tensor | None) -> torch.Tensor | None:
    """(B, 1, T, T) for left-padded prompts: causal, never onto a pad, a pad onto itself; None
    when no prompt has a pad (attention is then plain causal, which flash attention can run)."""
    if prompt_valid is None:
        return None
    width = prompt_valid.shape[1]
    causal = torch.ones(width, width, dtype=torch.bool, device=prompt_valid.device).tril()
    eye = torch.eye(width, dtype=torch.bool, device=prompt_valid.device)
    return ((causal & prompt_valid[:, None, :]) | eye)[:, None]


@dataclass
class CachedCall:
    """One forward through the cache: its tokens go to positions `index` of the cache. Prefill
    attends among the prompt's own tokens (`mask`: None for plain causal); a decode step attends
    over everything cached (`mask`: what it may see, None for everything)."""

    cache: Cache
    index: torch.Tensor  # (T,) int64: cache positions of this call's tokens
    mask: torch.Tensor | None
    prefill: bool

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q, k, v (B, heads, T, head_dim) of this call -> (B, heads, T, head_dim)."""
        cached_k, cached_v = self.cache.write(layer, k, v, self.index)
        if not self.prefill:
            k, v = cached_k, cached_v
        causal = self.prefill and self.mask is None
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask, is_causal=causal)
