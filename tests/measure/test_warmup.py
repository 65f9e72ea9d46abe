"""Warm-up meets every batch shape before the clock starts, padded compiled blocks are
dynamic from the start, and a timed window in which anything compiles or records a CUDA
graph is timed again."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from torch._dynamo.callback import CallbackTrigger, callback_handler

import autotune.measure.loop
import autotune.measure.setup
from autotune.config import RunSpec, TrainConfig
from autotune.data.batching import build_dataloader
from autotune.data.datasets import make_dataset
from autotune.knobs.apply import apply_model_knobs
from autotune.measure.loop import measure
from autotune.model.load import build_model

SPEC = RunSpec(model="gpt2-tiny", device="cpu", warmup=1, steps=2, min_time_s=0)
PADDED = TrainConfig(token_budget=2048)


def spy_steps(monkeypatch, on_step=None) -> list[tuple[int, int]]:
    """The shape of every batch measure() steps on, in order; `on_step(n)` runs before step n."""
    shapes: list[tuple[int, int]] = []
    real = autotune.measure.setup.make_train_step

    def make(*args, **kwargs):
        step = real(*args, **kwargs)

        def spied(x, y):
            if on_step is not None:
                on_step(len(shapes))
            shapes.append(tuple(x.shape))
            return step(x, y)

        return spied

    monkeypatch.setattr(autotune.measure.setup, "make_train_step", make)
    return shapes


def epoch_shapes(cfg: TrainConfig) -> set[tuple[int, int]]:
    """Every shape one epoch of the sampler yields, read from the batches themselves."""
    dataset = make_dataset("synthetic", vocab_size=320, seq_len=128, seed=0)
    return {tuple(x.shape) for x, _ in build_dataloader(dataset, cfg, seq_len=128, seed=0)}


@pytest.mark.slow
def test_warm_up_steps_on_every_batch_shape_before_the_clock_starts(monkeypatch):
    shapes = spy_steps(monkeypatch)
    m = measure(SPEC, PADDED)
    assert m.outcome == "ok", m.reason
    warm = shapes[: m.shape_warmup_steps + m.warmup_steps]
    expected = epoch_shapes(PADDED)
    assert len(expected) > 5  # padded batches: one shape per bucketed width, and the epoch's last batch
    assert expected <= set(warm)
    assert m.shape_warmup_steps == len(expected)  # eager: one quiet pass is enough
    # then one step on each extreme shape (the widest here is also the largest B x W), then the window
    assert m.warmup_steps == 1 and m.extreme_steps == 1 and len(shapes) == len(warm) + m.extreme_steps + m.steps


def test_a_compile_event_in_the_timed_window_has_it_timed_again(monkeypatch):
    """A CUDA graph recording (reduce-overhead meeting a new shape) lands in the first timed
    step: that window is dropped and another timed."""
    state = {"warm": False, "fired": 0}
    real_run_extremes = autotune.measure.loop.run_extremes

    def run_extremes(*args, **kwargs):  # the last steps before the window
        result = real_run_extremes(*args, **kwargs)
        state["warm"] = True
        return result

    def record_a_graph(_n):
        if state["warm"] and not state["fired"]:
            state["fired"] += 1
            with callback_handler.install_callbacks(CallbackTrigger.CUDAGRAPH_RECORDING, "0/0"):
                pass

    monkeypatch.setattr(autotune.measure.loop, "run_extremes", run_extremes)
    spy_steps(monkeypatch, record_a_graph)
    m = measure(SPEC, TrainConfig(token_budget=256, batching="fixed"))  # one shape: the window is what counts
    assert m.outcome == "ok", m.reason
    assert state["fired"] == 1
    assert m.retimed_windows == 1 and m.recompiles_during_timing == 0
    assert m.steps in (2, 4)  # a clean window (two when noisy)


def test_a_window_that_keeps_compiling_is_kept_after_the_retries_and_counted(monkeypatch):
    state = {"warm": False}
    real_warm_up = autotune.measure.setup.warm_up

    def warm_up(*args, **kwargs):
        result = real_warm_up(*args, **kwargs)
        state["warm"] = True
        return result

    def recompile_every_step(_n):
        if state["warm"]:
            with callback_handler.install_callbacks(CallbackTrigger.DYNAMO, "0/1"):
                with callback_handler.install_callbacks(CallbackTrigger.LAZY_BACKWARD, "0/1"):
                    pass  # nested: announced once, as torch announces them

    monkeypatch.setattr(autotune.measure.setup, "warm_up", warm_up)
    spy_steps(monkeypatch, recompile_every_step)
    m = measure(SPEC, TrainConfig(token_budget=256, batching="fixed"))
    assert m.retimed_windows >= autotune.measure.loop.MAX_RETIMES
    assert m.recompiles_during_timing == m.steps  # one event a step, in the window kept


@pytest.mark.parametrize("batching, dynamic", [("padded", True), ("packed", None), ("fixed", None)])
def test_padded_blocks_compile_with_dynamic_shapes_from_the_start(monkeypatch, batching, dynamic):
    calls: list[dict] = []
    monkeypatch.setattr(nn.Module, "compile", lambda self, *args, **kwargs: calls.append(kwargs))
    apply_model_knobs(build_model("gpt2-tiny"), TrainConfig(compile_mode="default", batching=batching))
    assert calls == [{"mode": "default", "dynamic": dynamic}] * 2  # one per block


@pytest.mark.compile
def test_a_compiled_padded_run_compiles_in_warm_up_and_never_while_timed(fresh_dynamo):
    m = measure(SPEC, TrainConfig(token_budget=2048, compile_mode="default"))
    assert m.outcome == "ok", m.reason
    shapes = len(epoch_shapes(PADDED))
    assert m.shape_warmup_steps == 2 * shapes  # a pass that compiled, then a quiet one
    assert m.recompiles_during_timing == 0 and m.retimed_windows == 0
    assert m.compile_time_s > 0
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1
