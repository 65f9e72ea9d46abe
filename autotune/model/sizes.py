"""The GPT-2 family's shapes, by name. Without torch: the tuner reads a model's shape here
before any trial, and importing torch costs it seconds of CPU and hundreds of MiB."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MODEL_SIZES", "GPTConfig", "ModelDims"]


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


@dataclass(frozen=True)
class ModelDims:
    """What the tuner's memory and cost priors need of any model: depth, width and vocabulary
    (read without torch for our models, by the probe for a user's)."""

    n_layer: int
    d_model: int
    vocab_size: int

    @property
    def n_params(self) -> int:
        # 12 d^2 per block (attention 4 d^2, MLP 8 d^2) plus the tied embedding (Kaplan et al. 2020)
        return 12 * self.n_layer * self.d_model**2 + self.vocab_size * self.d_model
