"""autotune.model.load: model names, user model factories and their errors."""

from __future__ import annotations

import pytest
import torch

from autotune.errors import UsageError
from autotune.model.introspect import find_blocks, model_shape
from autotune.model.load import build_model
from autotune.model.sizes import MODEL_SIZES


def test_unknown_model_lists_the_names():
    with pytest.raises(UsageError) as info:
        build_model("nope")
    message = str(info.value)
    assert "'nope'" in message and "package.module:factory" in message
    for name in MODEL_SIZES:
        assert name in message


def test_user_factory_builds_a_llama_style_model():
    model = build_model("tests.fixture_models:make_llama")
    from tests.fixture_models import LlamaLike

    assert isinstance(model, LlamaLike)
    assert find_blocks(model) is model.model.layers
    shape = model_shape(model)
    assert (shape.vocab_size, shape.context_length, shape.n_layer) == (300, 64, 2)
    x = torch.randint(0, 300, (2, 16))
    loss = model(x, x)
    assert loss.dim() == 0 and torch.isfinite(loss)


@pytest.mark.parametrize(
    "name, message",
    [
        ("tests.no_such_module:make", "cannot import module 'tests.no_such_module'"),
        ("tests.fixture_models:missing", "has no callable 'missing'"),
        ("tests.fixture_models:not_a_module", "expected a torch.nn.Module"),
    ],
)
def test_bad_user_factories_are_usage_errors(name, message):
    with pytest.raises(UsageError, match=message):
        build_model(name)
