"""User factories around Hugging Face models, loaded as `tests.model.hf_factories:<name>` the
way `autotune bench --model pkg.mod:factory` loads a user's: a plain `GPT2LMHeadModel`, a
wrapper that returns HF's `.loss` for the labels it is given (it shifts them: autotune must
refuse it), and a wrapper that returns the logits (autotune scores them itself)."""

from __future__ import annotations

import torch.nn as nn
from transformers import GPT2Config, GPT2LMHeadModel

TINY = dict(n_layer=2, n_head=2, n_embd=64, n_positions=128, vocab_size=320, bos_token_id=256, eos_token_id=256)


def plain_gpt2() -> GPT2LMHeadModel:
    return GPT2LMHeadModel(GPT2Config(**TINY))


class ReturnsHFLoss(nn.Module):
    """What a user writes to fit `model(input_ids, labels)`: HF shifts `labels` again."""

    def __init__(self) -> None:
        super().__init__()
        self.hf = plain_gpt2()
        self.vocab_size = self.hf.config.vocab_size
        self.context_length = self.hf.config.n_positions

    @property
    def transformer(self):  # where autotune finds the blocks (transformer.h)
        return self.hf.transformer

    def forward(self, input_ids, labels):
        return self.hf(input_ids=input_ids, labels=labels).loss


class ReturnsLogits(ReturnsHFLoss):
    def forward(self, input_ids, labels=None):
        return self.hf(input_ids=input_ids).logits


def shifting_wrapper() -> ReturnsHFLoss:
    return ReturnsHFLoss()


def logits_wrapper() -> ReturnsLogits:
    return ReturnsLogits()
