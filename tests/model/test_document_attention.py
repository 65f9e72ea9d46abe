"""attention_mask=document: with document_ids, a token attends to its own document only.

FlexAttention runs forward only on CPU in torch 2.13, so these run the model without
gradients (training with it on CPU is `unsupported`, see tests/knobs/test_knob_support.py)."""

from __future__ import annotations

import pytest
import torch

from autotune.model import build_model
from autotune.model.attention import document_causal_mask

T = 128  # gpt2-tiny's context


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return build_model("gpt2-tiny").eval()


def window_with_documents(bounds=(0, 37, 90), seed=0):
    """(1, T) ids and their document ids: documents start at `bounds`."""
    ids = torch.randint(1, 320, (1, T), generator=torch.Generator().manual_seed(seed))
    docs = torch.zeros(1, T, dtype=torch.int32)
    for start in bounds[1:]:
        docs[:, start:] += 1
    return ids, docs


@torch.no_grad()
@pytest.mark.slow
def test_a_token_cannot_attend_across_a_document_boundary(model):
    ids, docs = window_with_documents()
    changed = ids.clone()
    changed[:, 40:90] = torch.randint(1, 320, (1, 50), generator=torch.Generator().manual_seed(1))  # document 1
    before, after = model(ids, document_ids=docs), model(changed, document_ids=docs)
    # Document 2 (positions 90..) does not see document 1: unchanged, to the last bit.
    torch.testing.assert_close(after[:, 90:], before[:, 90:], rtol=0, atol=0)
    # Document 0 is before the change; document 1 itself changes.
    torch.testing.assert_close(after[:, :40], before[:, :40], rtol=0, atol=0)
    assert not torch.allclose(after[:, 40:90], before[:, 40:90])
    # Without document ids (causal), the same change reaches every later position: the
    # test above would fail if the mask were not applied.
    causal_before, causal_after = model(ids), model(changed)
    assert (causal_after[:, 90:] - causal_before[:, 90:]).abs().amin(dim=-1).gt(0).all()


@torch.no_grad()
@pytest.mark.slow
def test_a_document_attends_as_if_it_started_the_window(model):
    """The first document's outputs equal a causal run over it alone (positions agree too,
    as it starts the window): nothing of what follows leaks back, and the mask is causal."""
    ids, docs = window_with_documents()
    masked = model(ids, document_ids=docs)
    alone = model(ids[:, :37])
    torch.testing.assert_close(masked[:, :37], alone, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_one_document_per_window_is_plain_causal_attention(model):
    ids, _ = window_with_documents()
    one = torch.zeros(1, T, dtype=torch.int32)
    torch.testing.assert_close(model(ids, document_ids=one), model(ids), rtol=1e-5, atol=1e-5)


def test_document_mask_is_causal_within_documents_only():
    docs = torch.tensor([[0, 0, 1, 1, 1, 2, 2, 2]], dtype=torch.int32)
    dense = torch.zeros(8, 8, dtype=torch.bool)
    mask_mod = document_causal_mask(docs).mask_mod
    for q in range(8):
        for kv in range(8):
            dense[q, kv] = bool(mask_mod(torch.tensor(0), torch.tensor(0), torch.tensor(q), torch.tensor(kv)))
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0, 0, 0],
            [0, 0, 1, 0, 0, 0, 0, 0],
            [0, 0, 1, 1, 0, 0, 0, 0],
            [0, 0, 1, 1, 1, 0, 0, 0],
            [0, 0, 0, 0, 0, 1, 0, 0],
            [0, 0, 0, 0, 0, 1, 1, 0],
            [0, 0, 0, 0, 0, 1, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(dense, expected)
