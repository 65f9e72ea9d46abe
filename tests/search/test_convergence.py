"""autotune.search.convergence: the rule on constructed sequences, its K and noise from a
study's own figures, the Optuna callback that stops a study, the sampler's constant liar, and
`search --until-converged` with stand-in trials."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
from click.testing import CliRunner
from optuna.trial import TrialState, create_trial

from autotune.cli import main
from autotune.measure import outcomes
from autotune.search.convergence import (
    MAX_NOISE,
    MIN_NOISE,
    ConvergenceRule,
    StopWhenConverged,
    budget_stop,
    feasible_values,
    measurement_noise,
    patience_for,
    space_dimensions,
)
from autotune.search.run import SearchSettings, is_shared
from autotune.search.sampler import make_sampler
from autotune.space.file import load_space
from tests.attack_helpers import FAST, fake_trials
from tests.helpers import write_space

SPACES = Path(__file__).resolve().parents[2] / "autotune" / "search_spaces"
RULE = ConvergenceRule(patience=10, noise=0.02)


def test_a_best_that_stopped_moving_converges_after_k_trials():
    climbing = [100.0, 120.0, None, 150.0]  # the last real gain at index 3
    flat = [149.0, 151.0, None, 140.0, 152.0, 150.0, 148.0, 153.0, 151.0]  # 9 trials, gains within 2 %
    assert not RULE.converged(climbing + flat)
    assert RULE.trials_since_improvement(climbing + flat) == 9
    assert RULE.converged(climbing + flat + [150.0])  # the 10th
    assert RULE.trials_since_improvement(climbing + flat + [150.0]) == 10


def test_a_search_still_improving_does_not_converge():
    improving = [100.0 * 1.03**i if i % 5 == 0 else 90.0 for i in range(60)]  # a 3 % gain every 5th trial
    assert not RULE.converged(improving)
    assert all(not RULE.converged(improving[:n]) for n in range(1, 61))


def test_no_feasible_trial_is_not_converged():
    assert RULE.trials_since_improvement([None] * 50) is None and not RULE.converged([None] * 50)


def test_creeping_gains_within_the_noise_do_not_reset_the_count():
    creeping = [100.0 * 1.01**i for i in range(12)]  # 1 % per trial, under the 2 % noise
    assert RULE.trials_since_improvement(creeping) == 11 and RULE.converged(creeping)


def test_k_from_the_space():
    cpu = load_space(SPACES / "cpu.yaml", n_layer=2, seq_len=128)
    gpu = load_space(SPACES / "gpt2.yaml", n_layer=12, seq_len=1024)
    assert space_dimensions(cpu) == 12 and patience_for(space_dimensions(cpu)) == 24
    assert space_dimensions(gpu) == 14 and patience_for(space_dimensions(gpu)) == 28
    assert patience_for(2) == 10


def ok_trial(value: float, cv: float | None = 0.03, number: int = 0, **attrs) -> optuna.trial.FrozenTrial:
    measurement = {"step_time_cv": cv} if cv is not None else {}
    t = create_trial(
        value=value,
        user_attrs={"outcome": outcomes.OK, "tokens_per_sec": value, "measurement": measurement, **attrs},
        constraints={"memory": -0.5},
    )
    t.number = number
    return t


def test_noise_from_the_trials_step_time_spread_and_repeats():
    trials = [ok_trial(100, 0.03), ok_trial(110, 0.05), ok_trial(120, 0.04), ok_trial(90, 0.5, duplicate_of=0)]
    assert measurement_noise(trials) == pytest.approx(0.04)  # the median; a duplicate measured nothing new
    assert measurement_noise(trials, repeats=[(100.0, 110.0)]) == pytest.approx(0.0952, rel=1e-3)
    assert measurement_noise([ok_trial(100, 0.001)]) == MIN_NOISE
    assert measurement_noise([ok_trial(100, 0.4)]) == MAX_NOISE
    assert measurement_noise([]) == MIN_NOISE


def test_feasible_values_in_finishing_order():
    first = ok_trial(100)
    over = create_trial(value=500.0, user_attrs={"outcome": outcomes.OVER_MEMORY_LIMIT}, constraints={"memory": 0.3})
    pruned = create_trial(state=TrialState.PRUNED, user_attrs={"outcome": outcomes.UNSUPPORTED})
    running = create_trial(state=TrialState.RUNNING)
    last = ok_trial(120)
    assert feasible_values([last, over, first, running, pruned]) == [100.0, None, None, 120.0]


def measured_objective(values):
    """An objective that returns `values` in turn, recorded as the search records an ok trial."""
    it = iter(values)

    def objective(trial):
        value = next(it)
        trial.set_user_attr("outcome", outcomes.OK)
        trial.set_user_attr("measurement", {"step_time_cv": 0.02})
        trial.set_constraint("memory", -0.5)
        return value

    return objective


def test_the_callback_stops_a_study_whose_best_stopped_moving():
    stop = StopWhenConverged(n_dimensions=3)  # K = 10, noise 2 %
    study = optuna.create_study(direction="maximize")
    study.optimize(measured_objective([100.0, 200.0] + [199.0] * 100), n_trials=100, callbacks=[stop])
    assert len(study.trials) == 12 and stop.fired == ConvergenceRule(10, 0.02)


def test_the_callback_lets_an_improving_study_run():
    stop = StopWhenConverged(n_dimensions=3)
    study = optuna.create_study(direction="maximize")
    study.optimize(measured_objective([100.0 * 1.05**i for i in range(40)]), n_trials=40, callbacks=[stop])
    assert len(study.trials) == 40 and stop.fired is None


# --- constant liar -----------------------------------------------------------------------------------


def test_workers_sharing_a_study_sample_with_a_constant_liar():
    assert make_sampler(0, shared=True)._constant_liar is True
    assert make_sampler(0)._constant_liar is False
    lone = SearchSettings()
    assert not is_shared(lone, "sqlite:///studies/s.db")
    assert is_shared(lone, "journal:studies/s.journal") and is_shared(lone, "postgresql://u@h/db")
    assert is_shared(SearchSettings(worker=True), "sqlite:///studies/s.db")  # a --devices worker


# --- the command line ------------------------------------------------------------------------------


def test_search_until_converged_says_why_it_stopped(tmp_path, monkeypatch):
    """Stand-in trials measure tokens/s = the token budget (tests/spaces/tiny.yaml: 1024 or 2048),
    so the best stops moving at once: the search stops K trials after it, without --n-trials."""
    monkeypatch.chdir(tmp_path)
    fake_trials(monkeypatch)
    space = write_space(
        tmp_path,
        """
        version: 1
        fixed: {batching: padded, num_workers: 0, amp_dtype: float32}
        dimensions:
          token_budget: {choices: [1024, 2048]}
          sdpa_backend: {choices: [math, flash]}
        """,
    )
    # In memory: a database file's commits would take most of the test's time.
    run = ["search", *FAST, "--space", str(space), "--storage", "sqlite://"]
    result = CliRunner().invoke(main, [*run, "--until-converged", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["stopped"]["reason"] == "converged" and out["stopped"]["patience"] == 10  # 2 knobs: the floor
    assert out["stopped"]["noise"] == MIN_NOISE  # the stand-in measurements carry no spread
    assert 10 < out["n_trials"] <= 14  # K after the best; the best (2048 tokens) comes within the first few
    text = CliRunner().invoke(main, [*run, "--n-trials", "2"])
    assert "stopped: --n-trials reached (2 trials run)" in text.stdout


def test_budget_stop_names_the_limit_that_ended_the_search():
    assert budget_stop(ran=5, n_trials=5, timeout_s=60).reason == "n_trials"
    assert budget_stop(ran=3, n_trials=5, timeout_s=60).text == "--timeout reached (60 s; 3 trials run)"


def test_devices_workers_get_the_runs_rules():
    from autotune.search.fleet import split_trials, worker_command

    settings = SearchSettings(model="gpt2", n_trials=None, until_converged=True, memory_model=False)
    cmd = worker_command(settings, study="s", memory_limit_bytes=10**9, trial_timeout_s=60, n_trials=None)
    assert "--until-converged" in cmd and "--no-memory-model" in cmd and "--n-trials" not in cmd
    assert split_trials(None, 3) == [None, None, None]
