"""autotune.measure.loop, the one measuring loop: a real short run has sane figures that agree
with the batches it stepped on; memory limits, unsupported configs and failures become
outcomes; data waits are really measured; the timed window lasts the steps and the minimum
time; a noisy run takes a second window. And the data knobs take effect in it: token_budget
and batching set the batches stepped on, num_workers where the items are loaded."""

from __future__ import annotations

import functools
import math
import os
import time
from pathlib import Path

import pytest
import torch

import autotune.measure.loop
import autotune.measure.setup
from autotune.config import TrainConfig
from autotune.data.datasets import make_dataset
from autotune.errors import UsageError
from autotune.measure import outcomes
from autotune.measure.loop import measure
from autotune.measure.measurement import Measurement
from autotune.model.load import build_model
from autotune.units import format_bytes
from tests.helpers import record_batches, tiny_spec

# One pytest-xdist worker runs this module, so that its module-scoped measurements (tiny_run, run_small)
# is made once, not in each worker.
pytestmark = pytest.mark.xdist_group("measure-loop")


def small_corpus(on_load=None):
    """A make_dataset for measure(): a smaller synthetic corpus (64k tokens, the same length
    distribution; packed mode materializes its stream, which at the default size costs
    seconds), calling `on_load()` before each item is loaded (a sleep, a note of the loader)."""

    def make(data, *, vocab_size, seq_len, seed, min_tokens=None):  # small, whatever the run asks
        inner = make_dataset("synthetic", vocab_size=vocab_size, seq_len=seq_len, seed=seed, min_tokens=seq_len * 512)
        return inner if on_load is None else HookedDataset(inner, on_load)

    return make


class HookedDataset:
    """A dataset's items, `on_load()` called before each one is loaded."""

    def __init__(self, inner, on_load) -> None:
        self.inner, self.lengths, self.on_load = inner, inner.lengths, on_load

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: int) -> torch.Tensor:
        self.on_load()
        return self.inner[i]


def log_pid(path: Path) -> None:
    with open(path, "a") as f:
        f.write(f"{os.getpid()}\n")


# --- a real run --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_run() -> tuple[Measurement, list, list]:
    """One real measurement, shared by the field checks, with the batches it stepped on."""
    with pytest.MonkeyPatch.context() as mp:
        record = record_batches(mp)
        m = measure(tiny_spec(), TrainConfig(token_budget=2048))
    return m, record.shapes, record.tokens


def test_real_run_is_ok_with_sane_figures(tiny_run):
    m, _, _ = tiny_run
    assert m.outcome == "ok" and m.reason is None
    assert m.tokens_per_sec > 0
    assert m.padded_tokens_per_sec >= m.tokens_per_sec
    assert 0 <= m.padding_fraction < 1
    assert m.step_time_median_s > 0 and m.step_time_cv >= 0
    assert 0 <= m.data_wait_fraction < 1
    assert m.steps >= 5 and m.warmup_steps == 1
    assert m.compile_time_s == 0.0 and m.recompiles_during_timing == 0
    assert m.peak_memory_bytes > 0 and m.peak_memory_source == "rss" and m.allocator_peak_bytes is None
    assert m.mfu is None  # no peak FLOPs for CPUs
    assert m.gpu_utilization is None
    assert m.device["kind"] == "cpu"
    assert math.isfinite(m.final_loss) and 4 < m.final_loss < 7  # ~ln(320) after a few steps
    assert m.model["name"] == "gpt2-tiny" and m.model["n_layer"] == 2 and m.model["seq_len"] == 128
    assert m.config == TrainConfig(token_budget=2048).to_dict()
    assert set(m.phase_s) >= {"setup", "warmup", "timed", "total"}


def test_real_run_figures_agree_with_the_batches(tiny_run):
    m, shapes, tokens = tiny_run
    timed = slice(m.warmup_steps, m.warmup_steps + m.steps)
    positions = sum(rows * width for rows, width in shapes[timed])
    assert len(shapes[timed]) == m.steps
    # Pads are counted from the batches themselves (labels == -100).
    assert m.padding_fraction == pytest.approx(1 - sum(tokens[timed]) / positions)
    # tokens_per_sec = non-pad tokens of the timed window / its wall time.
    wall = sum(tokens[timed]) / m.tokens_per_sec
    assert wall <= m.phase_s["timed"] + 1e-6
    assert wall >= m.step_time_median_s * math.ceil(m.steps / 2)  # half the steps took >= the median
    assert positions / m.padded_tokens_per_sec == pytest.approx(wall)


def test_measurement_round_trips_through_a_dict(tiny_run):
    m, _, _ = tiny_run
    assert Measurement.from_dict({**m.to_dict(), "unknown_future_field": 1}) == m


@pytest.mark.slow
def test_memory_limit_flags_the_run():
    m = measure(tiny_spec(steps=2, memory_limit_bytes=1024**2), TrainConfig(token_budget=1024))
    assert m.outcome == "over_memory_limit"
    assert format_bytes(m.peak_memory_bytes) in m.reason and "1.00 MiB" in m.reason
    assert m.tokens_per_sec > 0  # measured all the same: the sampler learns from it
    # ... and a limit above the peak is ok.
    assert measure(tiny_spec(steps=2, memory_limit_bytes=1024**4), TrainConfig(token_budget=1024)).outcome == "ok"


def test_unsupported_config_is_an_outcome_without_running(monkeypatch):
    def must_not_build(name):
        raise AssertionError("an unsupported config must be rejected before building the model")

    monkeypatch.setattr(autotune.measure.setup, "build_model", must_not_build)
    m = measure(tiny_spec(), TrainConfig(sdpa_backend="efficient"))
    assert m.outcome == "unsupported"
    assert m.reason.startswith("sdpa_backend:")
    assert m.tokens_per_sec is None and m.device["kind"] == "cpu"


def test_backend_failing_at_run_time_is_unsupported(monkeypatch):
    # Skip the static rules: the forced kernel then fails inside the step, and the error is
    # still classified as unsupported (never retried), not as a crash.
    monkeypatch.setattr(autotune.measure.loop, "check_supported", lambda cfg, caps: None)
    m = measure(tiny_spec(steps=2), TrainConfig(sdpa_backend="efficient", token_budget=1024))
    assert m.outcome == "unsupported"
    assert m.reason.startswith("sdpa_backend:") and "No viable backend" in m.reason


def test_a_crash_inside_the_run_is_an_outcome(monkeypatch):
    def broken(name):
        model = build_model(name)

        def explode(x):
            raise ValueError("boom in block 1")

        model.transformer.h[1].forward = explode
        return model

    monkeypatch.setattr(autotune.measure.setup, "build_model", broken)
    m = measure(tiny_spec(steps=2), TrainConfig(token_budget=1024))
    assert m.outcome == "crashed"
    assert m.reason.startswith("ValueError: boom in block 1") and "explode" in m.reason  # with its traceback tail
    assert m.tokens_per_sec is None


def test_bad_input_is_raised_not_an_outcome():
    with pytest.raises(UsageError, match="longer than the model's context"):
        measure(tiny_spec(seq_len=256), TrainConfig())


def test_user_model_runs_with_checkpointing():
    m = measure(
        tiny_spec(model="tests.fixture_models:make_llama", steps=3),
        TrainConfig(token_budget=512, checkpoint_layers=(1,)),
    )
    assert m.outcome == "ok", m.reason
    assert m.model["seq_len"] == 64 and m.model["vocab_size"] == 300 and m.model["n_layer"] == 2
    assert m.mfu is None and m.tokens_per_sec > 0


# --- data waits, the minimum time, noise ----------------------------------------------------------


@pytest.mark.slow
def test_data_waits_are_measured(monkeypatch):
    delay = 0.02

    cfg = TrainConfig(batching="fixed", token_budget=1024)  # 8 items, so >= 160 ms of waiting per step
    fast = measure(tiny_spec(steps=3), cfg)
    monkeypatch.setattr(autotune.measure.setup, "make_dataset", small_corpus(lambda: time.sleep(delay)))
    starved = measure(tiny_spec(steps=3), cfg)
    assert fast.outcome == starved.outcome == "ok"

    def wait_per_step(m: Measurement) -> float:
        wall = 8 * 128 * m.steps * (1 - m.padding_fraction) / m.tokens_per_sec  # fixed: 8 x 128 per step
        return m.data_wait_fraction * wall / m.steps

    # Sleeping is a lower bound of the wait, whatever the load on the machine: 8 items per step.
    sleep = 8 * delay
    assert wait_per_step(starved) >= sleep * 0.99
    # In-process synthetic items cost well under a millisecond each (a few even on a loaded box).
    assert wait_per_step(fast) < sleep / 4
    assert starved.data_wait_fraction > fast.data_wait_fraction
    assert fast.data_wait_fraction < 0.5
    # A step is timed mark to mark, its wait for the batch included.
    assert starved.step_time_median_s > sleep


@pytest.mark.slow
def test_the_timed_window_lasts_at_least_min_time():
    """On a fast device --steps alone gives a window too short to reproduce: the loop keeps
    stepping until both the step count and the minimum time are reached."""
    cfg = TrainConfig(token_budget=1024, batching="fixed")  # one batch shape to warm up: the window is the subject
    short = measure(tiny_spec(steps=2, min_time_s=0), cfg)
    # Time for 8 steps at the pace this machine runs them now (slower when it is loaded): more
    # than the 2 (or 4) steps alone give, even if the machine then runs them at half that pace.
    min_time = max(0.25, 8 * short.step_time_median_s)
    timed = measure(tiny_spec(steps=2, min_time_s=min_time), cfg)
    assert short.steps in (2, 4)  # 4 when the CV check took a second window
    assert timed.steps > short.steps, (short.steps, short.phase_s, timed.steps, timed.phase_s)
    assert timed.phase_s["timed"] >= min_time


@pytest.mark.slow
def test_a_noisy_run_takes_a_second_window_then_is_flagged_unstable(monkeypatch):
    """Noise cannot be ordered on a shared CPU: a target no run can meet stands for it."""
    monkeypatch.setattr(autotune.measure.loop, "CV_TARGET", -1.0)
    m = measure(tiny_spec(steps=2), TrainConfig(token_budget=1024))
    assert m.outcome == outcomes.OK and m.unstable is True
    assert m.steps == 4 and m.step_time_cv is not None  # two windows of 2 steps: more samples before judging


# --- the data knobs take effect ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def run_small():
    """measure() on the small corpus, 2 steps, for a set of data knobs: the measurement and the
    batch shapes it stepped on. Each set is measured once a module (the tests only read them)."""
    runs: dict = {}

    def run(**knobs) -> tuple[Measurement, list]:
        key = tuple(sorted(knobs.items()))
        if key not in runs:
            with pytest.MonkeyPatch.context() as mp:
                record = record_batches(mp)
                mp.setattr(autotune.measure.setup, "make_dataset", small_corpus())
                m = measure(tiny_spec(steps=2), TrainConfig(**knobs))
            assert m.outcome == "ok", m.reason
            runs[key] = (m, list(record.shapes))
        return runs[key]

    return run


@pytest.mark.slow
def test_token_budget_sets_the_tokens_of_each_step(run_small):
    _, small = run_small(batching="fixed", token_budget=1024)
    _, large = run_small(batching="fixed", token_budget=4096)
    assert set(small) == {(8, 128)}  # 1024 // 128 full-width rows
    assert set(large) == {(32, 128)}
    _, padded = run_small(batching="padded", token_budget=1024)
    assert all(rows * width <= 1024 for rows, width in padded)
    assert max(rows * width for rows, width in padded) > 1024 - 128  # the budget is filled


@pytest.mark.slow
def test_batching_mode_sets_the_padding(run_small):
    fixed, fixed_shapes = run_small(batching="fixed", token_budget=1024)
    padded, padded_shapes = run_small(batching="padded", token_budget=1024)
    packed, packed_shapes = run_small(batching="packed", token_budget=1024)
    assert set(fixed_shapes) == set(packed_shapes) == {(8, 128)}  # full context rows
    assert min(width for _, width in padded_shapes) < 128  # padded to the batch's longest only
    assert packed.padding_fraction == 0.0
    assert padded.padding_fraction > 0 and fixed.padding_fraction > padded.padding_fraction
    # Synthetic documents have a median of a quarter context: fixed-width rows are mostly pad.
    assert fixed.padding_fraction > 0.5
    for m in (fixed, padded, packed):
        # effective = padded throughput * non-pad share: the two rates agree with the fraction.
        assert m.tokens_per_sec == pytest.approx(m.padded_tokens_per_sec * (1 - m.padding_fraction))


@pytest.mark.slow
def test_measure_loads_data_in_worker_processes(batch_record, monkeypatch, tmp_path):
    log = tmp_path / "pids"

    monkeypatch.setattr(autotune.measure.setup, "make_dataset", small_corpus(functools.partial(log_pid, log)))
    cfg = TrainConfig(num_workers=2, prefetch_factor=3, persistent_workers=True, token_budget=1024)
    m = measure(tiny_spec(steps=3), cfg)
    assert m.outcome == "ok", m.reason
    (loader,) = batch_record.loaders
    assert (loader.num_workers, loader.prefetch_factor, loader.persistent_workers, loader.pin_memory) == (
        2,
        3,
        True,
        False,
    )
    pids = {int(line) for line in log.read_text().split()}
    assert os.getpid() not in pids and len(pids) == 2  # the items were loaded by two workers


@pytest.mark.slow
def test_measure_loads_in_process_without_workers(monkeypatch, tmp_path):
    log = tmp_path / "pids"
    monkeypatch.setattr(autotune.measure.setup, "make_dataset", small_corpus(functools.partial(log_pid, log)))
    m = measure(tiny_spec(steps=2), TrainConfig(token_budget=1024))
    assert m.outcome == "ok", m.reason
    assert {int(line) for line in log.read_text().split()} == {os.getpid()}


@pytest.mark.slow
def test_a_short_window_clearly_below_the_threshold_is_not_measured_fully():
    """The search passes its best less a margin: a run whose short first window is clearly below
    it stops there (a quarter of the steps), one above it is timed in full, the short window merged in.
    (Without an interval, twice the window's spread is the margin.)"""
    cfg = TrainConfig(token_budget=1024, batching="packed")
    pruned = measure(tiny_spec(steps=16, prune_below_tokens_per_sec=1e12), cfg)
    assert pruned.outcome == outcomes.OK and pruned.short_window
    assert pruned.steps == 4 and pruned.tokens_per_sec > 0  # a quarter of the 16 steps
    full = measure(tiny_spec(steps=16, prune_below_tokens_per_sec=1.0), cfg)
    assert not full.short_window and full.steps >= 16
    plain = measure(tiny_spec(steps=8), cfg)
    assert not plain.short_window and plain.steps >= 8
