"""autotune.model.gpt: the GPT-2 sizes, the tied head, the loss contract (pads ignored, no
leak from pads)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from autotune.config import IGNORE_INDEX
from autotune.model.introspect import non_embedding_params
from autotune.model.load import build_model
from autotune.model.sizes import MODEL_SIZES
from tests.helpers import meta_model


def expected_params(n_layer: int, d: int, vocab: int, ctx: int) -> int:
    """GPT-2 counted by hand: per block attn (3d²+3d + d²+d), MLP (4d²+4d + 4d²+d), two
    LayerNorms (4d) = 12d² + 13d; token + position embeddings; final LayerNorm; tied head (0)."""
    return n_layer * (12 * d * d + 13 * d) + vocab * d + ctx * d + 2 * d


@pytest.mark.parametrize(
    "name, millions", [("gpt2", 124), ("gpt2-medium", 355), ("gpt2-large", 774), ("gpt2-xl", 1558)]
)
@pytest.mark.slow
def test_real_sizes_have_gpt2_parameter_counts(name, millions):
    model = meta_model(name)
    cfg = MODEL_SIZES[name]
    n = sum(p.numel() for p in model.parameters())  # parameters() yields the tied weight once
    assert cfg.vocab_size == 50304 and cfg.block_size == 1024
    assert n == expected_params(cfg.n_layer, cfg.n_embd, 50304, 1024)
    assert n == pytest.approx(millions * 1e6, rel=0.01)


def test_gpt2_is_124m_with_padded_vocab():
    n = sum(p.numel() for p in meta_model("gpt2").parameters())
    assert n == 124_475_904  # 124.4M: GPT-2's 124M plus 47 padded vocabulary rows of 768
    # The MFU count excludes only the position embedding (nanoGPT's non-embedding count).
    assert non_embedding_params(meta_model("gpt2")) == n - 1024 * 768


def test_head_is_tied_to_token_embedding():
    model = build_model("gpt2-tiny")
    assert model.lm_head.weight is model.transformer.wte.weight
    meta = meta_model("gpt2")
    assert meta.lm_head.weight is meta.transformer.wte.weight


def test_tiny_is_the_documented_shape():
    cfg = MODEL_SIZES["gpt2-tiny"]
    assert (cfg.block_size, cfg.vocab_size, cfg.n_layer, cfg.n_embd) == (128, 320, 2, 64)


def test_tiny_forward_backward_gives_finite_loss_and_grads():
    torch.manual_seed(0)
    model = build_model("gpt2-tiny")
    x = torch.randint(0, 320, (3, 40))
    loss = model(x, torch.roll(x, -1, dims=1))
    assert loss.dim() == 0 and torch.isfinite(loss)
    # Random init: close to the uniform guess ln(vocab).
    assert abs(loss.item() - torch.log(torch.tensor(320.0)).item()) < 0.5
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert model.lm_head.weight.grad.abs().sum() > 0


def test_pad_labels_are_ignored_by_the_loss():
    torch.manual_seed(0)
    model = build_model("gpt2-tiny").eval()
    x = torch.randint(0, 320, (2, 24))
    labels = torch.randint(0, 320, (2, 24))
    labels[0, 10:] = IGNORE_INDEX  # right padding, as the collate makes it
    labels[1, 20:] = IGNORE_INDEX
    with torch.no_grad():
        loss = model(x, labels)
        logits = model(x)
        keep = labels != IGNORE_INDEX
        by_hand = F.cross_entropy(logits[keep], labels[keep])
        everything = F.cross_entropy(logits.flatten(0, 1), labels.clamp(min=0).flatten())
    assert loss.item() == pytest.approx(by_hand.item(), rel=1e-5)
    assert abs(loss.item() - everything.item()) > 1e-4  # pads would change it


def test_right_pad_inputs_do_not_leak_into_real_positions():
    """Attention is causal and pads are on the right: what sits at pad positions cannot
    change the loss (if attention looked ahead, it would)."""
    torch.manual_seed(0)
    model = build_model("gpt2-tiny").eval()
    x = torch.randint(1, 320, (2, 32))
    labels = torch.randint(0, 320, (2, 32))
    labels[:, 16:] = IGNORE_INDEX
    other = x.clone()
    other[:, 16:] = 0
    with torch.no_grad():
        assert model(x, labels).item() == pytest.approx(model(other, labels).item(), rel=1e-6)
        # ... whereas changing a real input token does change it.
        real = x.clone()
        real[:, 3] = (real[:, 3] + 1) % 320
        assert model(real, labels).item() != pytest.approx(model(x, labels).item(), rel=1e-6)
