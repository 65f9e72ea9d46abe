"""`bench`'s text says the global batch a run accumulated to, and that its steps are micro-steps."""

from __future__ import annotations

from autotune.config import TrainConfig
from autotune.measure.measurement import Measurement
from autotune.present.summaries import format_measurement


def measured(**fields) -> Measurement:
    base = dict(
        config=TrainConfig(token_budget=1024).to_dict(),
        outcome="ok",
        tokens_per_sec=1000.0,
        padded_tokens_per_sec=1100.0,
        padding_fraction=0.09,
        step_time_median_s=0.25,
        step_time_cv=0.01,
        data_wait_fraction=0.0,
        compile_time_s=0.0,
        peak_memory_bytes=10**8,
        peak_memory_source="rss",
        steps=8,
    )
    return Measurement(**{**base, **fields})


def test_the_global_batch_and_its_micro_steps_are_said_only_when_there_is_one():
    text = format_measurement(measured(accumulation_steps=4, optimizer_steps=2, global_batch_tokens=4096))
    assert "CV 1.0% over 8 micro-steps" in text
    said = "global batch        4096 tokens per optimizer step: 4 micro-batches of 1024 (2 optimizer steps timed)"
    assert said in text
    plain = format_measurement(measured())  # without a global batch, as before
    assert "over 8 steps" in plain and "global batch" not in plain
