"""Models for CPU tables, loaded like a user's own: `--model benchmarks.cpu_models:gpt2_4x256`.

gpt2-tiny's byte-level vocabulary (320) hides what the head costs at GPT-2's 50304; this one
keeps GPT-2's vocabulary and shrinks the rest so a step takes about a second on two cores."""

from __future__ import annotations

from autotune.model.gpt import GPT, GPTConfig


def gpt2_4x256() -> GPT:
    """4 blocks, 4 heads, 256 wide, context 256, GPT-2's padded vocabulary (16M parameters,
    13M of them the tied embedding and head)."""
    return GPT(GPTConfig(block_size=256, vocab_size=50304, n_layer=4, n_head=4, n_embd=256))
