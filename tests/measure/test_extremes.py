"""Worst-case memory (issue 16, item 1): the extreme batch shapes are found from the sampler's
shapes, run before the timed window, and a run is judged on the maximum over warm-up, those
steps and the window, while the window's own peak is kept beside it."""

from __future__ import annotations

import pytest
import torch

import autotune.measure.loop
import autotune.measure.setup
from autotune.config import TrainConfig
from autotune.measure.extremes import extreme_shapes
from autotune.measure.loop import measure
from autotune.measure.peaks import PeakReading
from autotune.model.load import build_model
from tests.helpers import tiny_spec

# --- which shapes are extreme --------------------------------------------------------------------


def test_the_widest_bucket_at_its_largest_batch_and_the_largest_b_x_w_are_extreme():
    shapes = [(2, 128), (1, 128), (18, 16), (11, 16)]  # widest first, as distinct_batch_shapes gives them
    assert extreme_shapes(shapes).shapes == [(2, 128), (18, 16)]


def test_one_batch_is_both_extremes_when_it_is_the_widest_and_the_largest():
    assert extreme_shapes([(8, 128), (16, 64), (3, 64)]).shapes == [(8, 128)]


def test_one_shape_runs_no_extra_step_and_says_so():
    extremes = extreme_shapes([(8, 128)])  # packed or fixed batching
    assert extremes.shapes == [] and extremes.note == (
        "one batch shape (8 x 128), which every timed step runs: no extreme step needed"
    )


# --- the loop judges the worst case ----------------------------------------------------------------

BASE = 100 * 2**20
PER_ATTENTION_CELL = 4096  # bytes per B x W x W: memory that grows with the width squared


def attention_bytes(shape: tuple[int, int]) -> int:
    b, w = shape
    return BASE + PER_ATTENTION_CELL * b * w * w


class ShapeMemory:
    """An exact memory meter: the peak of a phase is `attention_bytes` of the widest-costing
    batch the model ran since the meter last restarted."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, int]] = []
        self.phases: list[list[tuple[int, int]]] = []

    def read(self) -> PeakReading:
        return PeakReading(max(map(attention_bytes, self.seen), default=BASE), "rss")

    def restart(self) -> None:
        self.phases.append(self.seen)
        self.seen = []


class OneLongDocument:
    """299 documents of 17 tokens (width 16) and one of 129 (width 128, the only one)."""

    def __init__(self) -> None:
        self.lengths = [129] + [17] * 299

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.arange(self.lengths[i]) % 300


@pytest.fixture
def meter(monkeypatch) -> ShapeMemory:
    """measure() on OneLongDocument, with gpt2-tiny's batches feeding a ShapeMemory meter."""
    meter = ShapeMemory()

    def tracked_model(name):
        model = build_model(name)
        model.register_forward_pre_hook(lambda _, args: meter.seen.append(tuple(args[0].shape)))
        return model

    monkeypatch.setattr(autotune.measure.setup, "build_model", tracked_model)
    monkeypatch.setattr(autotune.measure.setup, "make_dataset", lambda *a, **k: OneLongDocument())
    monkeypatch.setattr(autotune.measure.loop, "memory_meter", lambda session, host: meter)
    return meter


def test_a_model_is_judged_on_its_widest_batch_though_the_window_never_draws_it(meter):
    # Budget 300: the long document's batch is (2, 128); the short ones' (18, 16) is the largest B x W.
    m = measure(tiny_spec(warmup=0, steps=2, memory_limit_bytes=BASE + 2**30), TrainConfig(token_budget=300))

    warmup, extremes, window = meter.phases
    assert (2, 128) in warmup and extremes == [(2, 128), (18, 16)]
    assert all(w == 16 for _, w in window), "the window was to draw only short batches"
    assert m.outcome == "ok", m.reason
    assert m.extreme_shapes == [[2, 128], [18, 16]] and m.extremes_note is None
    assert m.peak_memory_bytes == m.extremes_peak_memory_bytes == attention_bytes((2, 128))
    assert m.window_peak_memory_bytes == max(map(attention_bytes, window)) < m.peak_memory_bytes


def test_a_widest_batch_over_the_limit_makes_the_run_over_the_limit(meter):
    limit = attention_bytes((2, 128)) - 1  # the window's batches fit; the widest does not
    m = measure(tiny_spec(warmup=0, steps=2, memory_limit_bytes=limit), TrainConfig(token_budget=300))
    assert m.window_peak_memory_bytes <= limit
    assert m.outcome == "over_memory_limit"


@pytest.mark.parametrize("batching", ["packed", "fixed"])
def test_one_shape_batching_runs_no_extreme_step_and_says_so(batching, monkeypatch):
    from tests.measure.test_loop import small_corpus

    monkeypatch.setattr(autotune.measure.setup, "make_dataset", small_corpus())
    m = measure(tiny_spec(warmup=0, steps=2), TrainConfig(token_budget=256, batching=batching))
    assert m.outcome == "ok", m.reason
    assert m.extreme_shapes == [] and m.extremes_peak_memory_bytes is None
    assert m.extremes_note == "one batch shape (2 x 128), which every timed step runs: no extreme step needed"
    assert m.window_peak_memory_bytes <= m.peak_memory_bytes
