"""step_time_cv, the figure that flags a run unstable, is normalised by each step's modelled
FLOPs (issue 3/6): padded batches of equal positions but different widths differ in attention
work, and a run whose step times follow that work exactly is not noisy."""

from __future__ import annotations

import torch

from autotune.measure.flops import flops_per_token
from autotune.measure.loop import _Run, _Window
from autotune.model.introspect import ModelShape

GPT2 = ModelShape(vocab_size=50304, context_length=1024, n_layer=12, n_head=12, head_dim=64)
N_PARAMS = 85_000_000


def run_of(shape: ModelShape = GPT2) -> _Run:
    run = _Run.__new__(_Run)  # only the model's figures are needed to weigh a step
    run.n_params, run.shape = N_PARAMS, shape
    return run


def window(run: _Run, shapes: list[tuple[int, int]], seconds_per_flop: float, noise: list[float]) -> _Window:
    w = _Window()
    for (b, width), jitter in zip(shapes, noise):
        labels = torch.zeros(b, width, dtype=torch.long)
        w.work_per_step.append(run._step_work(labels))
        w.step_times.append(b * width * flops_per_token(N_PARAMS, GPT2, width) * seconds_per_flop * (1 + jitter))
    return w


# Equal positions per step (8 x 1024 = 16 x 512 = 32 x 256), attention work halving each time.
SHAPES = [(8, 1024), (16, 512), (32, 256)] * 4


def test_step_times_that_follow_the_modelled_flops_are_not_noise():
    w = window(run_of(), SHAPES, 1e-15, [0.0] * len(SHAPES))
    assert w.cv < 1e-9  # by positions alone these steps spread by about 7 %


def test_real_noise_still_shows():
    w = window(run_of(), SHAPES, 1e-15, [0.0, 0.2, -0.2] * 4)
    assert 0.12 < w.cv < 0.2


def test_a_model_that_does_not_say_its_heads_is_weighed_by_positions():
    run = run_of(ModelShape(vocab_size=320, context_length=128, n_layer=2, n_head=None, head_dim=None))
    assert run._step_work(torch.zeros(4, 100)) == 400
