"""autotune.knobs.checkpoint: checkpointed blocks really save fewer tensors for backward, keep
the numerics and the state dict, recompute with the forced kernel, on GPT-2 and user models."""

from __future__ import annotations

import copy

import pytest
import torch

from autotune.config import TrainConfig
from autotune.errors import UsageError
from autotune.knobs.apply import training_context
from autotune.knobs.checkpoint import apply_activation_checkpointing, is_checkpointed
from autotune.model.introspect import find_blocks
from autotune.model.load import build_model
from tests.helpers import FLASH_OP, MATH_OP, batch, tiny


def saved_for_backward(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[int, torch.Tensor]:
    """How many tensors autograd keeps for backward during one forward, and the loss."""
    count = 0

    def pack(t):
        nonlocal count
        count += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(x, y)
    return count, loss


def test_checkpointing_saves_fewer_tensors_per_block():
    base = tiny()
    x, y = batch()
    counts = {}
    for layers in [(), (0,), (0, 1)]:
        model = copy.deepcopy(base)
        apply_activation_checkpointing(model, layers)
        assert [is_checkpointed(b) for b in find_blocks(model)] == [i in layers for i in range(2)]
        counts[layers] = saved_for_backward(model, x, y)[0]
    assert counts[()] > counts[(0,)] > counts[(0, 1)]
    # The two blocks are identical: each checkpointed block saves the same amount less.
    assert counts[()] - counts[(0,)] == counts[(0,)] - counts[(0, 1)]


def test_checkpointing_keeps_state_dict_and_numerics():
    base = tiny()
    model = copy.deepcopy(base)
    apply_activation_checkpointing(model, (0, 1))
    assert list(model.state_dict()) == list(base.state_dict())
    model.load_state_dict(base.state_dict())  # a user's checkpoint still loads
    x, y = batch()
    loss_a, loss_b = base(x, y), model(x, y)
    loss_a.backward()
    loss_b.backward()
    torch.testing.assert_close(loss_b, loss_a)
    for (name, p), q in zip(base.named_parameters(), model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, msg=name)


def test_checkpointed_recomputation_uses_the_forced_backend():
    """Backward runs outside training_context; the recomputed forward of a checkpointed
    block must still use the forced kernel (else its saved tensors differ and checkpoint
    raises, or the trial silently measures another kernel)."""
    model = tiny()
    apply_activation_checkpointing(model, (0, 1))
    x, y = batch()
    with training_context("cpu", TrainConfig(sdpa_backend="math")):
        loss = model(x, y)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        loss.backward()  # the flags are back to "any backend" here: flash would be picked
    ops = {e.name for e in prof.events() if "attention" in e.name}
    assert MATH_OP in ops and FLASH_OP not in ops
    assert torch.backends.cuda.flash_sdp_enabled()  # and the forced choice did not leak out


def test_checkpointing_is_idempotent():
    model = tiny()
    apply_activation_checkpointing(model, (0,))
    forward = find_blocks(model)[0].forward
    apply_activation_checkpointing(model, (0,))
    assert find_blocks(model)[0].forward is forward  # not wrapped twice (recomputing twice)


def test_checkpoint_index_beyond_the_blocks_is_rejected():
    with pytest.raises(UsageError, match=r"block 2 does not exist, the model has 2 blocks \(0\.\.1\)"):
        apply_activation_checkpointing(tiny(), (0, 2))


def test_checkpointing_a_llama_style_user_model():
    base = build_model("tests.fixture_models:make_llama")
    x = torch.randint(0, 300, (2, 32))
    plain = saved_for_backward(base, x, x)
    model = copy.deepcopy(base)
    apply_activation_checkpointing(model, (1,))  # found at model.layers; layers take kwargs
    assert is_checkpointed(model.model.layers[1]) and not is_checkpointed(model.model.layers[0])
    checkpointed = saved_for_backward(model, x, x)
    assert checkpointed[0] < plain[0]
    torch.testing.assert_close(checkpointed[1], plain[1])


def test_explicit_block_path():
    model = build_model("tests.fixture_models:make_odd_path")
    with pytest.raises(UsageError, match="block_path="):
        apply_activation_checkpointing(model, (0,))  # backbone.stack is not a guessable path
    x = torch.randint(0, 300, (2, 32))
    before = saved_for_backward(model, x, x)[0]
    apply_activation_checkpointing(model, (0, 1), block_path="backbone.stack")
    assert all(is_checkpointed(b) for b in model.backbone.stack)
    assert saved_for_backward(model, x, x)[0] < before
    with pytest.raises(UsageError, match="names nothing"):
        find_blocks(model, "backbone.missing")
    with pytest.raises(UsageError, match="names Module"):
        find_blocks(model, "backbone")
