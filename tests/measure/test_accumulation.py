"""Gradient accumulation to a global batch (`RunSpec.global_batch_tokens`): the training step
steps the optimizer once per `accumulation_steps` micro-steps, with gradients equal to one big
batch's; the measuring loop times whole optimizer steps and counts every micro-step's tokens;
a token budget that does not divide the global batch is refused."""

from __future__ import annotations

import math

import pytest
import torch

import autotune.measure.loop
import autotune.measure.setup
from autotune.config import RunSpec, TrainConfig, accumulation_steps
from autotune.errors import UnsupportedConfig, UsageError
from autotune.measure import outcomes
from autotune.measure.loop import measure
from autotune.measure.step import make_train_step
from autotune.model.load import build_model
from tests.helpers import tiny_spec


class RecordingOptimizer(torch.optim.SGD):
    """SGD that keeps a copy of the gradients it was asked to step with."""

    def __init__(self, params) -> None:
        super().__init__(params, lr=0.1)
        self.seen: list[list[torch.Tensor]] = []

    def step(self, closure=None):
        self.seen.append([p.grad.detach().clone() for group in self.param_groups for p in group["params"]])
        return super().step(closure)


def _step(model, optimizer, steps: int):
    scaler = torch.amp.GradScaler("cpu", enabled=False)  # float32: as the loop makes it
    return make_train_step(
        model,
        optimizer,
        scaler,
        device=torch.device("cpu"),
        device_kind="cpu",
        cfg=TrainConfig(),
        accumulation_steps=steps,
    )


def _batch(rows: int, width: int = 32, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 320, (rows, width + 1), generator=g)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def test_the_optimizer_steps_once_every_accumulation_steps_micro_steps():
    torch.manual_seed(0)
    model = build_model("gpt2-tiny").train()
    optimizer = RecordingOptimizer(model.parameters())
    step = _step(model, optimizer, 4)
    before = [p.detach().clone() for p in model.parameters()]
    x, y = _batch(2)
    for n in range(1, 4):
        step(x, y)
        assert len(optimizer.seen) == 0 and step.pending == n
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # no update mid-group
    step(x, y)
    assert len(optimizer.seen) == 1 and step.pending == 0
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(p.grad is None for p in model.parameters())  # zeroed at the boundary, for the next group
    for _ in range(8):
        step(x, y)
    assert (step.micro_steps, step.optimizer_steps, len(optimizer.seen)) == (12, 3, 3)


def test_accumulated_gradients_equal_one_big_batch():
    """Four micro-batches of 2 rows, accumulated, step with the gradient of one batch of 8
    rows (equal real tokens per micro-batch: the mean of means is the mean)."""
    x, y = _batch(8, seed=1)

    def gradients(steps: int) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = build_model("gpt2-tiny").train()
        optimizer = RecordingOptimizer(model.parameters())
        step = _step(model, optimizer, steps)
        rows = 8 // steps
        for i in range(steps):
            step(x[i * rows : (i + 1) * rows], y[i * rows : (i + 1) * rows])
        assert len(optimizer.seen) == 1
        return optimizer.seen[0]

    big, accumulated = gradients(1), gradients(4)
    for a, b in zip(big, accumulated):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-7)


def test_accumulation_steps_is_the_global_batch_over_the_budget_exactly():
    assert accumulation_steps(None, 8192) == 1
    assert accumulation_steps(524288, 8192) == 64
    assert accumulation_steps(8192, 8192) == 1
    with pytest.raises(UnsupportedConfig, match="does not divide the global batch of 3000"):
        accumulation_steps(3000, 1024)
    with pytest.raises(UnsupportedConfig, match="more than the global batch"):
        accumulation_steps(1024, 2048)
    with pytest.raises(UsageError, match="global_batch_tokens"):
        RunSpec(global_batch_tokens=0)
    assert RunSpec(global_batch_tokens=4096).accumulation_steps(TrainConfig(token_budget=1024)) == 4


@pytest.mark.slow
def test_measure_times_whole_optimizer_steps_and_counts_every_micro_steps_tokens(monkeypatch):
    """A global batch of 4 micro-batches: warm-up ends, and the timed window starts and ends,
    at an optimizer-step boundary; the optimizer steps once per 4 micro-steps; tokens/s is
    the real tokens of every timed micro-step over the window's wall time."""
    micro: list[tuple[int, int]] = []  # (real tokens, positions) of each micro-step, in order
    optimizer_steps: list[int] = []  # micro-steps done at each optimizer step
    real_step, real_optimizer = autotune.measure.setup.make_train_step, autotune.measure.setup.make_optimizer

    def make_step(*args, **kwargs):
        step = real_step(*args, **kwargs)

        def spied(x, y, *rest):
            micro.append((int((y != -100).sum()), y.numel()))
            return step(x, y, *rest)

        return spied

    def make_optimizer(model, cfg):
        optimizer = real_optimizer(model, cfg)
        inner = optimizer.step

        def counted(*args, **kwargs):
            optimizer_steps.append(len(micro))
            return inner(*args, **kwargs)

        optimizer.step = counted
        return optimizer

    monkeypatch.setattr(autotune.measure.setup, "make_train_step", make_step)
    monkeypatch.setattr(autotune.measure.setup, "make_optimizer", make_optimizer)
    m = measure(tiny_spec(steps=3, global_batch_tokens=4096), TrainConfig(token_budget=1024))
    assert m.outcome == outcomes.OK, m.reason
    assert m.accumulation_steps == 4 and m.global_batch_tokens == 4096
    assert optimizer_steps == list(range(4, len(micro) + 1, 4))  # every 4th micro-step, and only then
    warm = m.shape_warmup_steps + m.warmup_steps + m.extreme_steps  # the extreme shapes: one optimizer step
    assert (
        m.extreme_steps == 4 and warm % 4 == 0 and m.steps % 4 == 0 and m.steps >= 4
    )  # 3 steps asked: one whole optimizer step
    assert len(micro) == warm + m.steps and m.optimizer_steps == m.steps // 4
    timed = micro[warm:]
    tokens, positions = sum(t for t, _ in timed), sum(p for _, p in timed)
    assert tokens < positions  # padded: real tokens, not positions, are counted
    wall = tokens / m.tokens_per_sec
    assert wall <= m.phase_s["timed"] + 1e-6
    assert wall >= m.step_time_median_s * math.ceil(m.steps / 2)
    assert positions / m.padded_tokens_per_sec == pytest.approx(wall)


def test_a_budget_that_does_not_divide_the_global_batch_is_unsupported():
    m = measure(tiny_spec(global_batch_tokens=3000), TrainConfig(token_budget=1024))
    assert m.outcome == outcomes.UNSUPPORTED
    assert "1024 does not divide the global batch of 3000" in m.reason


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
def test_cuda_graph_modes_cannot_accumulate(mode):
    """CUDA graphs replayed for each micro-batch overwrite the gradients accumulated in .grad
    (pytorch#169545: "accessing tensor output of CUDAGraphs that has been overwritten"; wrong
    gradients in #96693): refused with the reason wherever a run accumulates."""
    cfg = TrainConfig(compile_mode=mode, batching="packed", token_budget=1024)
    assert RunSpec(device="cuda:0").accumulation_steps(cfg) == 1  # one micro-batch a step: graphs are fine
    with pytest.raises(UnsupportedConfig) as info:
        RunSpec(device="cuda:0", global_batch_tokens=4096).accumulation_steps(cfg)
    assert info.value.knob == "compile_mode" and "pytorch#169545" in str(info.value)
    for other in ("default", "max-autotune-no-cudagraphs"):
        assert RunSpec(global_batch_tokens=4096).accumulation_steps(cfg.replace(compile_mode=other)) == 4
