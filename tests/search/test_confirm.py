"""The winner of a study (`search.confirm`): which leaders are re-measured, in fresh processes,
and the best mean becoming the study's best and its recipe."""

from __future__ import annotations

import dataclasses

import optuna
import pytest
from optuna.trial import TrialState, create_trial

from autotune.config import TrainConfig
from autotune.device import DeviceInfo
from autotune.measure.measurement import Measurement
from autotune.recipe.from_study import recipe_from_trial
from autotune.search.confirm import confirm_leaders
from autotune.study.leaders import Candidate, confirmation_key, leaders, to_remeasure, winner
from autotune.study.summary import summarize
from autotune.trial.runner import TrialResult
from tests.helpers import tiny_context

LIMIT = 2 * 1024**3


def add(study: optuna.Study, budget: int, rate: float, ci: list[float] | None, joules: float | None = None) -> None:
    config = TrainConfig(token_budget=budget).to_dict()
    m = Measurement(config=config, outcome="ok", tokens_per_sec=rate, tokens_per_sec_ci95=ci, peak_memory_bytes=10**8)
    m.joules_per_token = joules
    attrs = {"config": config, "outcome": "ok", "measurement": m.to_dict(), "tokens_per_sec": rate}
    study.add_trial(create_trial(state=TrialState.COMPLETE, value=rate, constraints={"memory": -0.5}, user_attrs=attrs))


def study_of(*trials: tuple[int, float, list[float] | None]) -> optuna.Study:
    study = optuna.create_study(direction="maximize")
    study.set_user_attr("memory_limit_bytes", LIMIT)
    study.set_user_attr("model", "gpt2-tiny")
    for budget, rate, ci in trials:
        add(study, budget, rate, ci)
    return study


def fake_runs(monkeypatch, rates: dict[int, float]) -> list[int]:
    """Re-measurements in 'fresh processes': each budget measures the rate given for it."""
    calls: list[int] = []

    def run_trial(spec, cfg, **kwargs):
        calls.append(cfg.token_budget)
        m = Measurement(config=cfg.to_dict(), outcome="ok", tokens_per_sec=rates[cfg.token_budget])
        return TrialResult("ok", None, m)

    monkeypatch.setattr("autotune.search.training.run_trial", run_trial)
    return calls


def test_overlapping_leaders_are_all_remeasured_and_the_best_mean_wins(monkeypatch):
    """#0 ran highest, but #1 and #2 are within its interval: the three are measured again,
    and #1 has the best mean (1000 + 1080) / 2: it is the study's best and its recipe."""
    study = study_of(
        (256, 1050.0, [1000.0, 1100.0]),
        (512, 1000.0, [950.0, 1050.0]),
        (1024, 990.0, [940.0, 1040.0]),
        (2048, 500.0, [480.0, 520.0]),  # not a leader
    )
    calls = fake_runs(monkeypatch, {256: 960.0, 512: 1080.0, 1024: 1000.0})
    told: list[tuple[int, int, int]] = []  # what the progress display hears: trial, run k of n
    reporter = type("Reporter", (), {"confirming": lambda self, *run: told.append(run)})()
    assert confirm_leaders(study, summarize(study).leaders, tiny_context(), reporter) == [0, 1, 2]
    assert calls == [256, 512, 1024] and told == [(0, 1, 3), (1, 2, 3), (2, 3, 3)]
    summary = summarize(study)
    assert summary.best.number == 1
    recipe = recipe_from_trial(summary, study.study_name, "sqlite:///x.db")
    assert recipe.config.token_budget == 512 and recipe.measured["tokens_per_sec"] == 1040.0
    assert recipe.measured["tokens_per_sec_runs"] == [1000.0, 1080.0]
    # Run again (a resumed study): nothing is measured twice.
    assert confirm_leaders(study, summarize(study).leaders, tiny_context()) == [] and len(calls) == 3


def test_a_best_clear_of_the_others_is_remeasured_alone(monkeypatch):
    study = study_of((256, 2000.0, [1900.0, 2100.0]), (512, 1000.0, [950.0, 1050.0]), (1024, 990.0, [940.0, 1040.0]))
    calls = fake_runs(monkeypatch, {256: 1950.0})
    confirm_leaders(study, summarize(study).leaders, tiny_context())
    assert calls == [256] and summarize(study).best.number == 0
    assert study.user_attrs[confirmation_key(0)]["tokens_per_sec"] == 1950.0


def test_an_unknown_interval_cannot_be_told_apart():
    top = [Candidate(0, 2000.0, (1900.0, 2100.0)), Candidate(1, 1000.0, None)]
    assert [c.number for c in to_remeasure(top)] == [0, 1]


def test_the_leaders_are_distinct_configurations_and_a_failed_remeasurement_drops_its_leader():
    ranked = [Candidate(0, 10.0), Candidate(1, 9.9), Candidate(2, 9.8), Candidate(3, 9.7)]
    assert [c.number for c in leaders(ranked, ["a", "a", "b", "c"])] == [0, 2, 3]
    top = [
        Candidate(0, 10.0, remeasured=True, second=None),  # its second run ran out of memory
        Candidate(2, 9.8, remeasured=True, second=9.9),
        Candidate(3, 9.7, remeasured=True, second=9.6),
    ]
    assert winner(top).number == 2
    # Not re-measured yet (a search stopped before): the best single run, as before.
    assert winner([Candidate(0, 10.0), Candidate(2, 9.8, remeasured=True, second=12.0)]).number == 0


def test_a_trial_whose_one_run_stands_above_the_winners_mean_is_measured_again_too(monkeypatch):
    """The three leaders' second runs came in lower (the winner's curse): #0's mean is 975, and
    #3, a fourth configuration, ran once at 980. Left at that, it stands above the choice in every
    list of figures (a generation study's front put it above the recommended trial). It is
    measured again; its mean, 990, then wins."""
    study = study_of(
        (256, 1050.0, [1000.0, 1100.0]),
        (512, 1000.0, [950.0, 1050.0]),
        (1024, 990.0, [940.0, 1040.0]),
        (2048, 980.0, [930.0, 1030.0]),  # not a leader: the fourth
        (128, 500.0, [480.0, 520.0]),
    )
    calls = fake_runs(monkeypatch, {256: 900.0, 512: 880.0, 1024: 870.0, 2048: 1000.0})
    assert confirm_leaders(study, summarize(study).leaders, tiny_context()) == [0, 1, 2, 3]
    assert calls == [256, 512, 1024, 2048]
    summary = summarize(study)
    assert summary.best.number == 3 and summary.best.figure == 990.0
    best_mean = summary.best.figure
    assert all(t.figure <= best_mean for t in summary.trials if t.feasible)  # no single run above the choice


def test_a_challenger_that_falls_back_leaves_the_winner_and_none_is_measured_twice(monkeypatch):
    study = study_of(
        (256, 1050.0, [1000.0, 1100.0]),
        (512, 1000.0, [950.0, 1050.0]),
        (1024, 990.0, [940.0, 1040.0]),
        (2048, 980.0, [930.0, 1030.0]),
    )
    calls = fake_runs(monkeypatch, {256: 900.0, 512: 880.0, 1024: 870.0, 2048: 860.0})
    confirm_leaders(study, summarize(study).leaders, tiny_context())
    assert calls == [256, 512, 1024, 2048] and summarize(study).best.number == 0
    assert confirm_leaders(study, summarize(study).leaders, tiny_context()) == [] and len(calls) == 4


def readings(monkeypatch, runs: dict[int, list[float]]) -> list[int]:
    """Re-measurements in 'fresh processes': each budget reads its next rate, in order (and as
    many tokens per joule)."""
    calls: list[int] = []

    def run_trial(spec, cfg, **kwargs):
        calls.append(cfg.token_budget)
        rate = runs[cfg.token_budget].pop(0)
        m = Measurement(config=cfg.to_dict(), outcome="ok", tokens_per_sec=rate)
        m.joules_per_token = 1 / rate
        return TrialResult("ok", None, m)

    monkeypatch.setattr("autotune.search.training.run_trial", run_trial)
    return calls


def on_a_gpu():
    """The tiny study's task, as a search on a GPU has it (its trials are faked here)."""
    return dataclasses.replace(tiny_context(), device=DeviceInfo(kind="cuda", name="NVIDIA H100 (fake)"))


def near_tie() -> optuna.Study:
    return study_of((256, 1050.0, [1000.0, 1100.0]), (512, 1000.0, [950.0, 1050.0]), (1024, 990.0, [940.0, 1040.0]))


def test_near_tied_leaders_are_measured_again_on_a_gpu_until_four_runs_each(monkeypatch):
    """After their second runs #0 (1050, 1000: mean 1025) and #1 (1000, 1040: 1020) are 0.5 %
    apart, under what two runs each can tell on a GPU's 1.5 % spread: both are measured again,
    until told apart or four runs each. #1's four runs (mean 1033.75) beat #0's (1006.25): it is
    the study's best and its recipe; two runs each would have chosen #0."""
    study = near_tie()
    calls = readings(monkeypatch, {256: [1000.0, 990.0, 985.0], 512: [1040.0, 1050.0, 1045.0], 1024: [900.0]})
    assert confirm_leaders(study, summarize(study).leaders, on_a_gpu()) == [0, 1, 2, 0, 1, 1, 0]
    assert calls == [256, 512, 1024, 256, 512, 512, 256]  # the leader by mean first
    summary = summarize(study)
    assert summary.best.number == 1 and summary.best.figure == 1033.75
    low, high = summary.best.figure_ci95  # from the four runs' spread (Student's t, 3 degrees of freedom)
    assert 1033.75 - low == pytest.approx(high - 1033.75) == pytest.approx(3.182 * 22.8674 / 2, rel=1e-4)
    recipe = recipe_from_trial(summary, study.study_name, "sqlite:///x.db")
    assert recipe.measured["tokens_per_sec_runs"] == [1000.0, 1040.0, 1050.0, 1045.0]
    # Resumed: four runs each is the most; nothing is measured again.
    assert confirm_leaders(study, summarize(study).leaders, on_a_gpu()) == [] and len(calls) == 7


def test_on_a_cpu_near_tied_leaders_are_not_measured_again(monkeypatch):
    """A CPU's 6 % spread: four runs each could not resolve a 3 % difference, so none is taken."""
    study = near_tie()
    calls = readings(monkeypatch, {256: [1000.0], 512: [1040.0], 1024: [900.0]})
    assert confirm_leaders(study, summarize(study).leaders, tiny_context()) == [0, 1, 2]
    assert calls == [256, 512, 1024] and summarize(study).best.number == 0


def test_an_energy_study_takes_no_further_runs_of_its_near_ties(monkeypatch):
    """Further runs read tokens/s alone: an energy study's leaders, near-tied in tokens per joule
    on a GPU, are measured once more each and no further."""
    study = optuna.create_study(direction="maximize")
    for key, value in (("memory_limit_bytes", LIMIT), ("model", "gpt2-tiny"), ("objective", "tokens_per_joule")):
        study.set_user_attr(key, value)
    for budget, rate, ci in ((256, 1050.0, [1000.0, 1100.0]), (512, 1000.0, [950.0, 1050.0]), (1024, 990.0, None)):
        add(study, budget, rate, ci, joules=1 / rate)
    calls = readings(monkeypatch, {256: [1000.0] * 9, 512: [1040.0] * 9, 1024: [900.0] * 9})
    confirm_leaders(study, summarize(study).leaders, on_a_gpu())
    assert calls == [256, 512, 1024]
