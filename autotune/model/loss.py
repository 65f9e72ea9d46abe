"""The head's loss from the final hidden states: `lm_head` and cross-entropy in one function,
so how it is computed (knob `loss_impl`) can change without touching the model.

Both take hidden (..., C) after the final norm, the head's weight (V, C) and labels (...)
with IGNORE_INDEX at pads, and return the mean cross-entropy over the non-pad labels.

- `standard_linear_cross_entropy`: logits (N, V), then `F.cross_entropy`. No explicit fp32
  copy: under autocast the cross-entropy upcasts by itself, and when compiled the upcast is
  fused into the softmax kernel instead of materializing fp32 logits.
- `chunked_linear_cross_entropy`: the tokens in `chunks` slices; each slice's logits are
  made, turned into its loss and its gradients, and freed before the next, so the full
  (N, V) logits never exist. The gradients are computed in the forward pass (as Liger
  Kernel's fused linear cross-entropy does), so no logits are kept for backward and no
  matmul is recomputed: the same three head matmuls as `standard`, in pieces.

Per token, `standard` keeps V fp32 log-probabilities for backward (196 KiB at GPT-2's 50304)
and makes V logits in the compute dtype, an fp32 copy and V fp32 gradients on the way;
`chunked` keeps C fp32 gradients of the hidden state (3 KiB at width 768) plus one slice of
logits at a time (measured: `python benchmarks/loss_memory.py`). A chunked step does the
same three head matmuls, in slices; an evaluation step (no gradients) skips two of them.
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import torch
import torch.nn.functional as F

from autotune.config import IGNORE_INDEX

# A slice's logits hold at most this many elements (256 MiB in fp32): at GPT-2's vocabulary
# 50304, slices of ~1300 tokens, large enough to keep the matmuls efficient...
CHUNK_LOGITS = 1 << 26
# ...and at most this many slices, since a compiled head unrolls the slice loop: past
# 32 x 1300 tokens the slices grow instead (2048 tokens each at a budget of 65536).
MAX_CHUNKS = 32

LinearCrossEntropy = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def standard_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    logits = F.linear(hidden, weight)  # (..., V)
    return F.cross_entropy(logits.flatten(0, -2), labels.flatten(), ignore_index=IGNORE_INDEX)


def chunk_count(tokens: int, vocab_size: int) -> int:
    """Slices for at most `tokens` tokens per step: each slice's logits within CHUNK_LOGITS,
    at most MAX_CHUNKS. Fixed per configuration (from the token budget, not the batch), so
    a compiled head keeps one graph for every batch shape: the slice bounds are symbolic,
    their count is not."""
    return min(MAX_CHUNKS, max(1, math.ceil(tokens * vocab_size / CHUNK_LOGITS)))


def chunked(*, chunks: int | None = None, max_tokens: int | None = None) -> LinearCrossEntropy:
    """`chunked_linear_cross_entropy` with its slicing bound (see there)."""
    for name, value in (("chunks", chunks), ("max_tokens", max_tokens)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    return functools.partial(chunked_linear_cross_entropy, chunks=chunks, max_tokens=max_tokens)


def chunked_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    chunks: int | None = None,
    max_tokens: int | None = None,
) -> torch.Tensor:
    """chunks: how many slices; else as many as keep a slice's logits within CHUNK_LOGITS
    for `max_tokens` tokens (the step's token budget; default: this batch's token count)."""
    hidden2d = hidden.flatten(0, -2)  # (N, C)
    labels1d = labels.flatten()  # (N,)
    if chunks is None:
        chunks = chunk_count(max_tokens or hidden2d.shape[0], weight.shape[0])
    compute_dtype = _compute_dtype(hidden2d)
    if torch.is_grad_enabled() and (hidden2d.requires_grad or weight.requires_grad):
        return _ChunkedLinearCrossEntropy.apply(hidden2d, weight, labels1d, chunks, compute_dtype)
    with torch.no_grad():  # evaluation: the same slices, no gradients made
        loss, _, _ = _chunked_forward(hidden2d, weight, labels1d, chunks, compute_dtype, with_grads=False)
    return loss


def _compute_dtype(hidden: torch.Tensor) -> torch.dtype:
    """The matmul dtype autocast would pick (the slices cast once, explicitly)."""
    device_type = hidden.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return hidden.dtype


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, labels, chunks, compute_dtype):  # type: ignore[override]
        loss, grad_hidden, grad_weight = _chunked_forward(hidden, weight, labels, chunks, compute_dtype, True)
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.hidden_dtype, ctx.weight_dtype = hidden.dtype, weight.dtype
        return loss

    @staticmethod
    def backward(ctx, grad_loss):  # type: ignore[override]
        grad_hidden, grad_weight = ctx.saved_tensors
        # d(loss)/d(inputs) were computed in forward, in fp32, for a loss gradient of 1. Scaled
        # first (a GradScaler's 2**16 is in grad_loss), then cast to the inputs' dtypes: a
        # float16 input's gradient of 1/n_valid would flush to zero the other way round.
        return (
            (grad_hidden * grad_loss).to(ctx.hidden_dtype),
            (grad_weight * grad_loss).to(ctx.weight_dtype),
            None,
            None,
            None,
        )


def _chunked_forward(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    chunks: int,
    compute_dtype: torch.dtype,
    with_grads: bool,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(mean loss, d loss / d hidden, d loss / d weight), slice by slice; the gradients in fp32.

    For one slice with logits z (n, V), p = softmax(z) and target y: loss_i = logsumexp(z_i)
    - z_i[y_i], and d loss / d z_i = (p_i - onehot(y_i)) / n_valid for a non-pad label, else 0.
    Then d hidden = dz @ W and d W = dz^T @ hidden, in the compute dtype, accumulated in fp32.

    The matmuls take p - onehot (at most 1 in magnitude) and the 1 / n_valid is applied to
    their fp32 results: p / n_valid in float16 flushes to zero below 2**-25 (every entry but
    the targets' at GPT-2's vocabulary and 8k tokens), before a GradScaler's scale, which
    reaches the gradient only in backward, could lift it. float16 then holds p down to 2**-25
    itself, as the standard loss's scaled gradient does; bfloat16 has fp32's range either way."""
    n = hidden.shape[0]
    valid_count = (labels != IGNORE_INDEX).sum()
    # Gradients scale by 1 / n_valid; a batch of pads only has zero gradients (not 0/0).
    grad_scale = 1.0 / valid_count.clamp(min=1).to(torch.float32)
    w = weight.to(compute_dtype)
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    grad_hidden = torch.empty(hidden.shape, dtype=torch.float32, device=hidden.device) if with_grads else None
    grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if with_grads else None
    for i in range(chunks):
        # Symbolic bounds under torch.compile: one graph for every n, no guard on it.
        start, end = (i * n) // chunks, ((i + 1) * n) // chunks
        h = hidden.narrow(0, start, end - start).to(compute_dtype)  # (n_i, C)
        y = labels.narrow(0, start, end - start)  # (n_i,)
        valid = y != IGNORE_INDEX
        target = y.clamp(min=0).unsqueeze(1)  # a pad's -100 made a valid index; masked below
        logits = (h @ w.t()).float()  # (n_i, V) fp32: the only logits alive, one slice at a time
        lse = torch.logsumexp(logits, dim=1)
        total = total + torch.where(valid, lse - logits.gather(1, target).squeeze(1), 0.0).sum()
        if with_grads:
            # n_valid x d loss / d logits, in the logits' own memory: softmax, minus one at the
            # target, zero for a pad (the 1 / n_valid comes after the matmuls, in fp32).
            dz = logits.sub_(lse.unsqueeze(1)).exp_()
            dz.scatter_add_(1, target, torch.full_like(lse, -1.0).unsqueeze(1))
            dz = dz.mul_(valid.unsqueeze(1)).to(compute_dtype)  # (n_i, V)
            # In float16 these products stay in range: |dz| <= 1, so a slice's partial sums are
            # at most its tokens (<= 4096) x the largest hidden value, far from 65504 in practice.
            grad_hidden.narrow(0, start, end - start).copy_(dz @ w)  # into fp32
            grad_weight.add_(dz.t() @ h)
            del dz
        del logits
    loss = total / valid_count  # NaN when every label is a pad, as F.cross_entropy
    if not with_grads:
        return loss, None, None
    return loss, grad_hidden.mul_(grad_scale), grad_weight.mul_(grad_scale)
