"""loss_impl: the chunked head loss gives the standard loss and every gradient exactly (to
float rounding), and the full (tokens x vocab) logits never exist while it runs."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from autotune.config import IGNORE_INDEX, TrainConfig
from autotune.errors import UnsupportedConfig
from autotune.knobs.apply import apply_model_knobs
from autotune.model import build_model
from autotune.model.loss import (
    CHUNK_LOGITS,
    MAX_CHUNKS,
    chunk_count,
    chunked,
    chunked_linear_cross_entropy,
    standard_linear_cross_entropy,
)
from tests.fixture_models import make_llama


def head_inputs(tokens: int = 96, width: int = 16, vocab: int = 50, pads: int = 7, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(tokens, width, generator=g, requires_grad=True)
    weight = (0.3 * torch.randn(vocab, width, generator=g)).requires_grad_()
    labels = torch.randint(0, vocab, (tokens,), generator=g)
    labels[torch.randperm(tokens, generator=g)[:pads]] = IGNORE_INDEX
    return hidden, weight, labels


def loss_and_grads(fn, hidden, weight, labels):
    h, w = hidden.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    loss = fn(h, w, labels)
    (2.5 * loss).backward()  # a loss gradient other than 1: backward must scale by it
    return loss.detach(), h.grad, w.grad


@pytest.mark.parametrize("chunks", [1, 3, 7, 200])  # 200 > tokens: empty slices too
def test_chunked_equals_standard_loss_and_gradients(chunks):
    hidden, weight, labels = head_inputs()
    loss, gh, gw = loss_and_grads(standard_linear_cross_entropy, hidden, weight, labels)
    c_loss, c_gh, c_gw = loss_and_grads(chunked(chunks=chunks), hidden, weight, labels)
    torch.testing.assert_close(c_loss, loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(c_gh, gh, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(c_gw, gw, rtol=1e-5, atol=1e-7)
    assert c_gh[labels == IGNORE_INDEX].abs().max() == 0  # a pad position learns nothing


def test_chunked_takes_batched_hidden_states_and_no_grad():
    hidden, weight, labels = head_inputs(tokens=64)
    h3, y2 = hidden.detach().view(4, 16, -1), labels.view(4, 16)
    expected = F.cross_entropy(h3.reshape(64, -1) @ weight.detach().t(), labels, ignore_index=IGNORE_INDEX)
    with torch.no_grad():  # evaluation: the same slices, no gradients made
        got = chunked_linear_cross_entropy(h3, weight, y2, chunks=5)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


def test_chunked_under_bfloat16_autocast_matches_standard():
    hidden, weight, labels = head_inputs(tokens=64, width=32, vocab=96)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, gh, gw = loss_and_grads(standard_linear_cross_entropy, hidden, weight, labels)
        c_loss, c_gh, c_gw = loss_and_grads(chunked(chunks=4), hidden, weight, labels)
    assert c_loss.dtype == torch.float32 and c_gh.dtype == gh.dtype and c_gw.dtype == gw.dtype
    # Both run the matmuls in bf16 (8 bits of mantissa) from the same inputs: close as a
    # whole, each element within bf16 rounding of the two orders of summation.
    torch.testing.assert_close(c_loss, loss, rtol=1e-2, atol=1e-2)
    for got, want in ((c_gh, gh), (c_gw, gw)):
        assert (got - want).norm() / want.norm() < 1e-2


def fp16_scaled_grads(fn, hidden, weight, labels, scale: float = 65536.0):
    """Gradients as a float16 step makes them: autocast, the loss times a GradScaler's scale
    (its initial 2**16), then unscaled, as GradScaler.unscale_ does."""
    h, w = hidden.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.float16):
        loss = fn(h, w, labels)
    (loss * scale).backward()
    return h.grad / scale, w.grad / scale


def test_chunked_under_float16_autocast_and_loss_scaling_matches_standard():
    """A logit's gradient is (p - onehot) / n_valid. Made in float16 before the loss scale
    applies, every p / n under 2**-25 flushed to zero: at GPT-2's 50304 tokens and 8k-131k
    tokens a step that is every non-target entry (p ~ 2e-5), so the head learnt from the
    targets alone. Here in small: half the vocabulary is never a target and, with logits 9
    below the rest, gets p ~ 4e-6 at 1024 tokens; those rows learn only through p / n ~ 4e-9.
    Standard keeps them (the scale reaches its float16 gradient first); chunked must too."""
    g = torch.Generator().manual_seed(0)
    tokens, width, vocab = 1024, 16, 64
    hidden = torch.randn(tokens, width, generator=g)
    hidden[:, 0] = 1.0  # a feature every token has
    weight = 0.1 * torch.randn(vocab, width, generator=g)
    weight[vocab // 2 :, 0] = -9.0  # the unlikely rows
    labels = torch.randint(0, vocab // 2, (tokens,), generator=g)
    gh, gw = fp16_scaled_grads(standard_linear_cross_entropy, hidden, weight, labels)
    c_gh, c_gw = fp16_scaled_grads(chunked(chunks=4), hidden, weight, labels)
    untargeted = gw[vocab // 2 :]
    assert untargeted.abs().min() > 0  # standard: every row learns
    assert (c_gw[vocab // 2 :] - untargeted).norm() / untargeted.norm() < 2e-2  # chunked: the same
    for got, want in ((c_gh, gh), (c_gw, gw)):
        assert (got - want).norm() / want.norm() < 1e-2


class LargestTensor(TorchDispatchMode):
    """The most elements of any tensor an operator produced, forward and backward."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def largest_tensor_and_saved(fn, hidden, weight, labels) -> tuple[int, int]:
    saved: list[int] = []
    h, w = hidden.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    with LargestTensor() as mode:
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
            loss = fn(h, w, labels)
        loss.backward()
    return mode.largest, max(saved)


def test_chunked_never_makes_the_full_logits():
    tokens, vocab, width = 256, 512, 16
    hidden, weight, labels = head_inputs(tokens=tokens, width=width, vocab=vocab)
    full = tokens * vocab
    largest, saved = largest_tensor_and_saved(standard_linear_cross_entropy, hidden, weight, labels)
    assert largest == full and saved == full  # the measuring works: standard makes and keeps them
    largest, saved = largest_tensor_and_saved(chunked(chunks=8), hidden, weight, labels)
    assert largest == full // 8  # one slice of logits at a time
    assert saved == max(tokens * width, vocab * width)  # kept for backward: the two gradients only


def test_chunk_count_fixed_by_the_budget():
    assert chunk_count(2048, 50304) == -(-2048 * 50304 // CHUNK_LOGITS) == 2
    assert chunk_count(8192, 50304) == 7
    assert chunk_count(65536, 50304) == MAX_CHUNKS == 32  # then the slices grow: 2048 tokens each
    assert chunk_count(8192, 320) == 1
    with pytest.raises(ValueError):
        chunked(chunks=0)


def gpt_grads(model, x, y):
    loss = model(x, y)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def test_gpt_loss_impl_chunked_matches_standard_everywhere():
    torch.manual_seed(0)
    model = build_model("gpt2-tiny")
    chunked_model = copy.deepcopy(model)
    apply_model_knobs(chunked_model, TrainConfig(loss_impl="chunked", token_budget=512))
    assert model.linear_cross_entropy is standard_linear_cross_entropy
    assert chunked_model.linear_cross_entropy.keywords == {"chunks": None, "max_tokens": 512}
    x = torch.randint(0, 320, (4, 128))
    y = torch.randint(0, 320, (4, 128))
    y[:, 100:] = IGNORE_INDEX
    loss, grads = gpt_grads(model, x, y)
    c_loss, c_grads = gpt_grads(chunked_model, x, y)
    torch.testing.assert_close(c_loss, loss, rtol=1e-6, atol=1e-6)
    assert grads.keys() == c_grads.keys()
    for name in grads:
        torch.testing.assert_close(c_grads[name], grads[name], rtol=1e-4, atol=1e-7, msg=name)
    assert list(chunked_model.state_dict()) == list(model.state_dict())


def test_gpt_chunked_slices_follow_the_token_budget():
    """At GPT-2's vocabulary a budget of 2048 tokens is 2 slices: the knob's slices are
    what the head runs (the largest tensor is half the batch's logits)."""
    model = build_model("gpt2-tiny")
    apply_model_knobs(model, TrainConfig(loss_impl="chunked", token_budget=2048))
    hidden, weight, labels = head_inputs(tokens=64, width=16, vocab=50304)
    largest, _ = largest_tensor_and_saved(model.linear_cross_entropy, hidden, weight, labels)
    assert largest == 32 * 50304


def test_chunked_on_a_model_without_the_seam_is_unsupported():
    model = make_llama()
    with pytest.raises(UnsupportedConfig) as info:
        apply_model_knobs(model, TrainConfig(loss_impl="chunked"))
    assert info.value.knob == "loss_impl"
    assert str(info.value) == (
        "loss_impl: chunked needs the model to compute its loss through a linear_cross_entropy(hidden, weight, "
        "labels) attribute that autotune can replace (autotune's GPT does), or a transformers causal LM (its "
        "lm_head over its decoder's hidden states); LlamaLike computes its loss itself"
    )
    apply_model_knobs(model, TrainConfig(loss_impl="standard"))  # its own loss: nothing to change
