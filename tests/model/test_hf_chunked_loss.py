"""loss_impl=chunked on Hugging Face causal LMs (it was `unsupported`: `apply_to_model` raised,
while two of three CPU studies chose it and the hf export told users to call it). The chunked
loss from the decoder's hidden states and lm_head gives HF's own loss and every gradient, with
its conventions: unshifted labels, -100 ignored, Trainer's num_items_in_batch; a call without
labels or gradients is the model's own forward."""

from __future__ import annotations

import copy
import functools
import inspect
import pickle

import pytest
import torch

from autotune.config import IGNORE_INDEX, RunSpec, TrainConfig
from autotune.errors import UnsupportedConfig
from autotune.measure import outcomes
from autotune.measure.loop import measure
from autotune.model.hf_loss import has_head_loss
from autotune.model.load import build_model
from autotune.model.loss import chunked
from autotune.recipe import Recipe
from tests.helpers import HF

pytestmark = HF

MODELS = ["hf:gpt2-tiny", "hf:llama-tiny"]


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randint(1, 320, (3, 40), generator=torch.Generator().manual_seed(1))
    labels = x.clone()
    labels[0, 30:] = IGNORE_INDEX  # a padded row
    return x, labels


def loss_and_grads(model, **inputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    output = model(**inputs)
    output.loss.backward()
    return output.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", MODELS)
def test_chunked_on_an_hf_model_gives_its_loss_and_gradients(name):
    torch.manual_seed(0)
    model = build_model(name).eval()  # no dropout: both runs see the same network
    applied = Recipe(config=TrainConfig(loss_impl="chunked", token_budget=512)).apply_to_model(copy.deepcopy(model))
    assert has_head_loss(applied) and applied.linear_cross_entropy.keywords == {"chunks": None, "max_tokens": 512}
    x, labels = batch()
    for lce in (applied.linear_cross_entropy, chunked(chunks=3)):  # the recipe's one slice, and three
        applied.linear_cross_entropy = lce
        for extra in ({}, {"num_items_in_batch": torch.tensor(200)}):  # Trainer's count under accumulation
            loss, grads = loss_and_grads(model, input_ids=x, labels=labels, **extra)
            c_loss, c_grads = loss_and_grads(applied, input_ids=x, labels=labels, **extra)
            torch.testing.assert_close(c_loss, loss, rtol=1e-5, atol=1e-6)
            assert c_grads.keys() == grads.keys()
            for param in grads:
                torch.testing.assert_close(c_grads[param], grads[param], rtol=1e-4, atol=1e-6, msg=param)
    assert applied(input_ids=x, labels=labels).logits is None  # the full logits are never made
    assert list(applied.state_dict()) == list(model.state_dict())


@pytest.mark.parametrize("name", MODELS)
def test_calls_without_labels_or_gradients_are_the_models_own(name):
    model = build_model(name).eval()
    applied = Recipe(config=TrainConfig(loss_impl="chunked")).apply_to_model(copy.deepcopy(model))
    x, labels = batch()
    with torch.no_grad():
        torch.testing.assert_close(applied(input_ids=x).logits, model(input_ids=x).logits)
        evaluated = applied(input_ids=x, labels=labels)  # evaluation: HF's loss, with its logits
        torch.testing.assert_close(evaluated.loss, model(input_ids=x, labels=labels).loss)
        assert evaluated.logits is not None
    # Trainer reads forward's signature: the columns it keeps, whether it passes num_items_in_batch.
    assert inspect.signature(applied.forward) == inspect.signature(model.forward)
    again = pickle.loads(pickle.dumps(applied))  # DataLoader workers, torch.save: the seam goes along
    assert has_head_loss(again) and isinstance(again.__dict__["forward"], functools.partial)


def test_a_model_whose_logits_are_not_its_head_is_refused_unchanged():
    """Gemma 2 soft-caps its logits: a loss from lm_head alone would train it on other logits."""
    model = build_model("hf:gpt2-tiny")
    head = model.lm_head
    model.lm_head = torch.nn.Linear(head.in_features, head.out_features, bias=True)  # a head with a bias
    with pytest.raises(UnsupportedConfig, match="chunked needs a bias-free linear head"):
        Recipe(config=TrainConfig(loss_impl="chunked")).apply_to_model(model)
    model = build_model("hf:gpt2-tiny")
    original = type(model).forward
    type_ = type("SoftCapped", (type(model),), {})

    def capped(self, *args, **kwargs):
        output = original(self, *args, **kwargs)
        output.logits = 30 * torch.tanh(output.logits / 30)
        return output

    type_.forward = capped
    model.__class__ = type_
    with pytest.raises(UnsupportedConfig, match="logits are something else"):
        Recipe(config=TrainConfig(loss_impl="chunked")).apply_to_model(model)
    assert not has_head_loss(model) and "forward" not in model.__dict__


@pytest.mark.slow
def test_the_measuring_loop_runs_chunked_on_an_hf_model():
    """The search measures it as the recipe will train it (the trials were `unsupported`)."""
    spec = RunSpec(model="hf:llama-tiny", device="cpu", steps=2, warmup=1, min_time_s=0.0)
    m = measure(spec, TrainConfig(loss_impl="chunked", token_budget=1024))
    assert m.outcome == outcomes.OK, m.reason
    assert 4.0 < m.final_loss < 7.0  # about ln(320) at random weights
