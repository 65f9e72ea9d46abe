"""autotune.model.introspect: the block layout the knobs rely on, and the shape MFU reads."""

from __future__ import annotations

import pytest
import torch

from autotune.model.introspect import find_blocks, model_shape
from autotune.model.sizes import MODEL_SIZES
from tests.helpers import meta_model

REAL_SIZES = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")


@pytest.mark.parametrize("name", REAL_SIZES + ("gpt2-tiny",))
@pytest.mark.slow
def test_blocks_are_one_module_list_at_transformer_h(name):
    model = meta_model(name)
    blocks = find_blocks(model)
    assert blocks is model.transformer.h
    assert isinstance(blocks, torch.nn.ModuleList) and len(blocks) == MODEL_SIZES[name].n_layer
    shape = model_shape(model)
    cfg = MODEL_SIZES[name]
    assert (shape.vocab_size, shape.context_length, shape.n_layer, shape.n_head, shape.head_dim) == (
        cfg.vocab_size,
        cfg.block_size,
        cfg.n_layer,
        cfg.n_head,
        cfg.n_embd // cfg.n_head,
    )
