"""autotune's GPT generates through its KV cache (`model.decode`, `model.kv_cache`): the static
cache's greedy tokens are the dynamic cache's, and both are those of the plain reference that
runs the whole sequence through the model for every token, for left-padded batches of prompts
of different lengths too (a pad never reaches a real token)."""

from __future__ import annotations

import pytest
import torch

from autotune.model.decode import GreedyDecoder, full_recompute_greedy, left_pad
from autotune.model.load import build_model

NEW_TOKENS = 12


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return build_model("gpt2-tiny").eval()


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 320, (n,), generator=g).tolist() for n in (5, 9, 12, 3)]


@pytest.fixture(scope="module")
def reference(model, prompts):
    return [full_recompute_greedy(model, p, NEW_TOKENS) for p in prompts]


@pytest.mark.parametrize("cache", ["static", "dynamic"])
@pytest.mark.parametrize("bucket", [1, 16])
def test_cached_greedy_tokens_are_the_full_recompute_references(model, prompts, reference, cache, bucket):
    decoder = GreedyDecoder(model, cache_kind=cache, batch=len(prompts), max_len=16 + NEW_TOKENS)
    batch = left_pad(prompts, bucket)
    assert batch.has_pads and batch.width % bucket == 0
    assert decoder.generate(batch, NEW_TOKENS).tolist() == reference


def test_one_prompt_alone_static_equals_dynamic(model, prompts, reference):
    for cache in ("static", "dynamic"):
        decoder = GreedyDecoder(model, cache_kind=cache, batch=1, max_len=len(prompts[1]) + NEW_TOKENS)
        assert decoder.generate(left_pad([prompts[1]]), NEW_TOKENS)[0].tolist() == reference[1]


def test_mark_is_called_before_prefill_after_it_and_after_every_decode_step(model, prompts):
    marks = []
    GreedyDecoder(model, cache_kind="static", batch=1, max_len=32).generate(
        left_pad([prompts[0]]), NEW_TOKENS, lambda: marks.append(1)
    )
    assert len(marks) == NEW_TOKENS + 1  # one timestamp between each pair: TTFT, then one per token


@pytest.mark.parametrize("cache", ["static", "dynamic"])
def test_a_pad_never_reaches_a_real_token(model, prompts, cache):
    """The logits of a left-padded prompt are those of the prompt alone, after prefill and after a
    decode step (the greedy tokens alone could hide a small leak: random weights make wide margins)."""
    logits: list[torch.Tensor] = []
    real = model.lm_head.forward

    def spy(x):
        out = real(x)
        logits.append(out)
        return out

    model.lm_head.forward = spy
    try:
        for batch in (left_pad([prompts[0], prompts[2]], 16), left_pad([prompts[0]])):
            GreedyDecoder(model, cache_kind=cache, batch=batch.ids.shape[0], max_len=16 + 2).generate(batch, 2)
    finally:
        del model.lm_head.forward
    padded, alone = logits[:2], logits[2:]
    for step in range(2):
        torch.testing.assert_close(padded[step][0], alone[step][0], rtol=0, atol=1e-5)
