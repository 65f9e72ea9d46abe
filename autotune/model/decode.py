"""Greedy generation, gpt-fast style: a prefill over the prompts, then one decode step a token,
through a KV cache (`model.kv_cache`), with a fixed number of new tokens (no early stop at an
end-of-text token: every run generates the same work, and the timing means the same thing).

Two functions do the work, `prefill` and `decode_step`, each a whole forward plus the greedy
choice (argmax on the device, so nothing waits for the host between tokens): the knobs compile
them (or not) and pick their attention kernels (`knobs.generation`). The loop between them is
plain Python, as in a user's own decode loop: it feeds each step's token to the next, moves the
position on, and calls `mark()` after the prefill and after every step, where the measurement
records a timestamp (a CUDA event, or the host clock after a synchronize on a CPU).

Prompts are left-padded (`left_pad`): every row's last prompt token sits in the last column, so
one decode step serves the batch, and each row's positions count from its own first token."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn as nn

from autotune.config import padded_width
from autotune.model.generation_fields import PAD_ID
from autotune.model.kv_cache import Cache, CachedCall, make_cache, prefill_mask


@dataclass(frozen=True)
class PromptBatch:
    """Prompts left-padded to one width: ids and valid (B, W), and each prompt's length."""

    ids: torch.Tensor
    valid: torch.Tensor
    lengths: tuple[int, ...]

    @property
    def width(self) -> int:
        return int(self.ids.shape[1])

    @property
    def has_pads(self) -> bool:
        return any(n < self.width for n in self.lengths)

    def to(self, device: torch.device) -> "PromptBatch":
        return PromptBatch(self.ids.to(device), self.valid.to(device), self.lengths)


def left_pad(prompts: Sequence[Sequence[int]], bucket: int = 1) -> PromptBatch:
    """Token-id prompts as one left-padded batch, its width the longest prompt rounded up to a
    multiple of `bucket` (knob `prompt_bucket`: fewer distinct widths, fewer prefill graphs)."""
    width = padded_width(max(len(p) for p in prompts), bucket)
    ids = torch.full((len(prompts), width), PAD_ID, dtype=torch.long)
    valid = torch.zeros((len(prompts), width), dtype=torch.bool)
    for row, prompt in enumerate(prompts):
        if prompt:
            ids[row, width - len(prompt) :] = torch.as_tensor(list(prompt), dtype=torch.long)
            valid[row, width - len(prompt) :] = True
    return PromptBatch(ids, valid, tuple(len(p) for p in prompts))


def prefill(
    model: nn.Module,
    cache: Cache,
    ids: torch.Tensor,
    positions: torch.Tensor,
    index: torch.Tensor,
    mask: torch.Tensor | None,
) -> torch.Tensor:
    """The prompts' forward, their keys and values written to the cache: the first new token (B, 1)."""
    logits = model.forward_cached(ids, positions, CachedCall(cache, index, mask, prefill=True))
    return logits.argmax(dim=-1, keepdim=True)


def decode_step(
    model: nn.Module, cache: Cache, token: torch.Tensor, positions: torch.Tensor, index: torch.Tensor
) -> torch.Tensor:
    """One token's forward over everything cached: the next token (B, 1)."""
    mask = cache.decode_mask(index)
    logits = model.forward_cached(token, positions, CachedCall(cache, index, mask, prefill=False))
    return logits.argmax(dim=-1, keepdim=True)


Prefill = Callable[..., torch.Tensor]
Step = Callable[..., torch.Tensor]


class GreedyDecoder:
    """Generates for autotune's GPT: a cache of `cache_kind` for `batch` rows of up to
    `max_len` positions, and the prefill and step functions to run (plain, or as the knobs
    made them: compiled, under a forced attention kernel)."""

    def __init__(
        self,
        model: nn.Module,
        *,
        cache_kind: str,
        batch: int,
        max_len: int,
        prefill_fn: Prefill = prefill,
        step_fn: Step = decode_step,
    ) -> None:
        param = next(model.parameters())
        config = model.config
        self.model = model
        self.prefill_fn, self.step_fn = prefill_fn, step_fn
        self.device = param.device
        self.cache = make_cache(
            cache_kind,
            n_layer=config.n_layer,
            batch=batch,
            n_head=config.n_head,
            head_dim=config.n_embd // config.n_head,
            max_len=max_len,
            dtype=param.dtype,
            device=param.device,
        )

    @torch.inference_mode()
    def generate(self, prompts: PromptBatch, new_tokens: int, mark: Callable[[], None] = lambda: None) -> torch.Tensor:
        """`new_tokens` greedy tokens for each prompt, (B, new_tokens), on the model's device.
        `mark()` is called before the prefill, after it and after every decode step."""
        prompts = prompts.to(self.device)
        width = prompts.width
        lengths = torch.tensor(prompts.lengths, device=self.device)[:, None]
        positions = (torch.arange(width, device=self.device) - (width - lengths)).clamp(min=0)
        self.cache.start(prompts.valid)
        mask = prefill_mask(prompts.valid) if prompts.has_pads else None
        mark()
        token = self.prefill_fn(
            self.model, self.cache, prompts.ids, positions, torch.arange(width, device=self.device), mask
        )
        mark()
        # Clones: a CUDA graph's output is overwritten by its next replay.
        tokens = [token.clone()]
        position, index = lengths.clone(), torch.tensor([width], device=self.device)
        for _ in range(new_tokens - 1):
            token = self.step_fn(self.model, self.cache, token, position, index).clone()
            mark()
            tokens.append(token)
            position += 1
            index += 1
        return torch.cat(tokens, dim=1)


@torch.inference_mode()
def full_recompute_greedy(model: nn.Module, prompt: Sequence[int], new_tokens: int) -> list[int]:
    """The plain reference: no cache, the whole sequence through the model for every token."""
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt)], dtype=torch.long, device=device)
    for _ in range(new_tokens):
        logits = model(ids)[:, -1]
        ids = torch.cat([ids, logits.argmax(dim=-1, keepdim=True)], dim=1)
    return ids[0, len(prompt) :].tolist()
