"""A reference trial interrupted by Ctrl-C is run again when the study resumes (once), as a
killed tuner's trial is: without it the study never reports its speedups. Trials are faked."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from autotune.cli import main
from autotune.measure import outcomes
from autotune.search.references import BASELINE, CHECKLIST
from autotune.study.record import TrialRecord
from autotune.study.storage import load_study
from tests.attack_helpers import FAST, fake_trials

STUDY = "gpt2-tiny-cpu"


def search(*args: str):
    return CliRunner().invoke(main, ["search", *FAST, "--json", "--no-confirm", *args])


def interrupt_the_baseline(monkeypatch) -> None:
    """The first trial the search runs (the baseline) is stopped by Ctrl-C."""

    def run_trial(spec, cfg, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("autotune.search.training.run_trial", run_trial)


def reference_attempts(study) -> list[tuple[str, str | None]]:
    records = [TrialRecord.read(t) for t in study.trials]
    return [(r.reference, r.outcome and str(r.outcome)) for r in records if r.reference]


@pytest.mark.slow
def test_an_interrupted_reference_is_run_again_on_resume_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    interrupt_the_baseline(monkeypatch)
    assert search("--n-trials", "3").exit_code == 130
    assert reference_attempts(load_study(STUDY, None)) == [(BASELINE, outcomes.INTERRUPTED), (CHECKLIST, None)]

    fake_trials(monkeypatch)
    resumed = search("--n-trials", "3")
    assert resumed.exit_code == 0, resumed.output
    attempts = reference_attempts(load_study(STUDY, None))
    assert attempts[:2] == [(BASELINE, outcomes.INTERRUPTED), (CHECKLIST, outcomes.OK)]
    assert attempts[2:] == [(BASELINE, outcomes.OK)]  # the retry, before any proposal of the planner
    assert json.loads(resumed.stdout)["speedup_vs_baseline"] is not None

    again = search("--n-trials", "1")  # resumed once more: nothing left to retry
    assert again.exit_code == 0, again.output
    assert reference_attempts(load_study(STUDY, None)) == attempts


@pytest.mark.slow
def test_a_retried_reference_interrupted_again_is_not_retried_a_second_time(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    interrupt_the_baseline(monkeypatch)
    assert search("--n-trials", "3").exit_code == 130
    # Resumed and interrupted again: the retry of the baseline (the checklist waits first).
    calls: list = []
    fake_trials(monkeypatch, calls=calls)
    real = __import__("autotune.search.training", fromlist=["run_trial"]).run_trial

    def second(spec, cfg, **kwargs):
        if cfg.batching == "fixed":  # the baseline's fixed batch
            raise KeyboardInterrupt
        return real(spec, cfg, **kwargs)

    monkeypatch.setattr("autotune.search.training.run_trial", second)
    assert search("--n-trials", "3").exit_code == 130
    fake_trials(monkeypatch)
    assert search("--n-trials", "1").exit_code == 0
    baselines = [o for name, o in reference_attempts(load_study(STUDY, None)) if name == BASELINE]
    assert baselines == [outcomes.INTERRUPTED, outcomes.INTERRUPTED]
