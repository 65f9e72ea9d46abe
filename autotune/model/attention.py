"""Attention that stops at document boundaries, for packed windows (`attention_mask=document`).

A packed window holds the end of one document, whole documents, and the start of another.
Plain causal attention lets every token see the documents before it in the window; the
document mask lets a token see only the earlier tokens of its own document. It is built
with FlexAttention (`torch.nn.attention.flex_attention`): the mask is a `BlockMask`, so tiles
that cross a boundary are skipped, not computed and discarded (the same document mask
modded-nanogpt and torchtitan train GPT-2-class models with).

Where it runs (torch 2.13): on CUDA, compiled (FlexAttention is a fused kernel only under
torch.compile; eager it runs an unfused reference that materializes the T x T scores), in
training and inference. On CPU, FlexAttention runs forward only (`NotImplementedError:
FlexAttention does not support backward on CPU`), so training with it is rejected there by
`autotune.knobs.support`; inference works, and the tests use it to show the mask.

Positions stay absolute within the window (as modded-nanogpt does): the mask decides what
a token sees, not where it sits.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

_compiled_flex: Callable[..., torch.Tensor] | None = None


def document_causal_mask(document_ids: torch.Tensor) -> Any:
    """document_ids (B, T): the document index of each position (non-decreasing along T).
    Returns the BlockMask of causal attention within a document, shared by every layer."""
    from torch.nn.attention.flex_attention import create_block_mask

    def same_document_causal(b, h, q_idx, kv_idx):
        return (document_ids[b, q_idx] == document_ids[b, kv_idx]) & (q_idx >= kv_idx)

    batch, length = document_ids.shape
    return create_block_mask(same_document_causal, batch, None, length, length, device=document_ids.device)


def flex_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask: Any) -> torch.Tensor:
    """q, k, v (B, nh, T, hs) -> (B, nh, T, hs), attending where `block_mask` allows."""
    from torch.nn.attention.flex_attention import flex_attention as eager_flex

    if q.device.type != "cuda":
        return eager_flex(q, k, v, block_mask=block_mask)  # CPU: the reference kernel, forward only
    global _compiled_flex
    if _compiled_flex is None:
        # Compiled once per process, as torchtitan does; inside a compiled block or model,
        # dynamo inlines this call into the enclosing graph.
        _compiled_flex = torch.compile(eager_flex, dynamic=False)
    return _compiled_flex(q, k, v, block_mask=block_mask)
