"""Accumulation over several ranks communicates gradients once per optimizer step: on the last
micro-batch only (DDP's no_sync, FSDP2's set_requires_gradient_sync). Seen through a real,
one-rank, in-process gloo group: DDP's communication hook counts its calls; FSDP2 leaves the
sharded gradients unset until the step's last backward reduce-scatters them."""

from __future__ import annotations

import pytest
import torch

from autotune.config import TrainConfig
from autotune.knobs.apply import apply_model_knobs
from autotune.knobs.precision import grad_scaler
from autotune.measure.step import make_optimizer, make_train_step
from autotune.model.load import build_model


def _step(model, cfg, accumulation):
    optimizer = make_optimizer(model, cfg)
    return make_train_step(
        model,
        optimizer,
        grad_scaler("cpu", cfg.amp_dtype),
        device=torch.device("cpu"),
        device_kind="cpu",
        cfg=cfg,
        accumulation_steps=accumulation,
    )


def _batch(vocab=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, vocab, (2, 32), generator=g)
    return x, torch.roll(x, -1, dims=1)


def _counted_ddp(cfg):
    torch.manual_seed(0)
    model = apply_model_knobs(build_model("gpt2-tiny"), cfg, world_size=1)
    calls = []

    def hook(state, bucket):
        calls.append(bucket.index())
        future = torch.futures.Future()
        future.set_result(bucket.buffer())
        return future

    model.register_comm_hook(None, hook)
    return model, calls


def test_ddp_reduces_only_on_the_last_micro_batch(one_rank_group):
    cfg = TrainConfig(parallelism="ddp", bucket_cap_mb=1)
    model, calls = _counted_ddp(cfg)
    step = _step(model, cfg, 1)
    step(*_batch())
    per_backward = len(calls)
    assert per_backward >= 1
    model, calls = _counted_ddp(cfg)
    step = _step(model, cfg, 4)
    for i in range(3):
        step(*_batch(seed=i))
    assert calls == []  # three micro-batches under no_sync: nothing communicated
    step(*_batch(seed=3))
    assert len(calls) == per_backward and step.optimizer_steps == 1


@pytest.mark.slow
def test_fsdp2_reduce_scatters_only_on_the_last_micro_batch(one_rank_group):
    cfg = TrainConfig(parallelism="fsdp2")
    torch.manual_seed(0)
    model = apply_model_knobs(build_model("gpt2-tiny"), cfg, world_size=1)
    step = _step(model, cfg, 4)
    before = [p.detach().full_tensor().clone() for p in model.parameters()]
    for i in range(3):
        step(*_batch(seed=i))
        # no reduce-scatter yet: the sharded gradients are not set
        assert all(p.grad is None for p in model.parameters()), i
    step(*_batch(seed=3))
    assert step.optimizer_steps == 1
    assert any(not torch.equal(b, p.detach().full_tensor()) for b, p in zip(before, model.parameters()))
    # the next step's micro-batches skip it again
    step(*_batch(seed=4))
    assert all(p.grad is None for p in model.parameters())
