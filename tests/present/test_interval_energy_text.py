"""The 95 % interval and the energy figure as people read them: bench's text, the best's table
with the re-measured leaders."""

from __future__ import annotations

import optuna

from autotune.config import TrainConfig
from autotune.measure.measurement import Measurement
from autotune.present.summaries import best_table, format_measurement
from autotune.present.text import energy_text, rate_with_interval
from autotune.study.leaders import Candidate
from autotune.study.record import TrialRecord
from autotune.study.summary import StudySummary


def measurement(**figures) -> Measurement:
    base = dict(
        config=TrainConfig().to_dict(),
        outcome="ok",
        tokens_per_sec=12_345.0,
        padded_tokens_per_sec=13_000.0,
        padding_fraction=0.05,
        step_time_median_s=0.01,
        step_time_cv=0.02,
        data_wait_fraction=0.0,
        compile_time_s=0.0,
        peak_memory_bytes=10**8,
        peak_memory_source="rss",
        steps=20,
    )
    return Measurement(**{**base, **figures})


def test_bench_text_gives_the_interval_and_the_energy_or_why_not():
    text = format_measurement(
        measurement(tokens_per_sec_ci95=[12_100.0, 12_600.0], energy_note="no RAPL on this machine")
    )
    assert "12,345 (95%: 12,100-12,600)" in text
    assert "energy              n/a (no RAPL on this machine)" in text
    text = format_measurement(measurement(joules_per_token=0.0024, energy_source="nvml-device"))
    assert "2.4 mJ/token (417 tokens/J, nvml-device)" in text


def test_the_best_table_lists_the_remeasured_leaders_and_marks_the_best_mean():
    frozen = optuna.trial.create_trial(
        value=1000.0, user_attrs={"config": TrainConfig().to_dict(), "measurement": measurement().to_dict()}
    )
    frozen.number = 4
    trial = TrialRecord.read(frozen)
    leaders = [
        Candidate(1, 1050.0, remeasured=True, second=960.0),
        Candidate(4, 1000.0, remeasured=True, second=1080.0),
        Candidate(7, 990.0, remeasured=True, second=1000.0),
    ]
    summary = StudySummary("s", best=trial, baseline=None, checklist=None, leaders=leaders)
    text = best_table(summary)
    assert "re-measured #1" in text and "mean 1,005 over 1,050/960" in text
    assert "mean 1,040 over 1,000/1,080  <- best mean" in text


def test_without_an_interval_or_an_energy_figure():
    assert rate_with_interval(1000.0, None) == "1,000"
    assert energy_text(None) == "n/a"
