"""The trials a search is given are spent on configurations that run (issue D, #7: a generation
search's TPE proposed configurations its task refuses before any process starts, and each one
used up a trial). A refusal is recorded and the sampler learns from it; it is not counted; a
space that runs nothing here ends after MAX_REFUSED_IN_A_ROW refusals in a row."""

from __future__ import annotations

import dataclasses
import logging

import optuna

from autotune.config import TrainConfig
from autotune.search.objective import Objective
from autotune.search.optimize import MAX_REFUSED_IN_A_ROW, optimize
from autotune.search.training import TrainTask
from autotune.study.record import read_trials
from autotune.trial.runner import TrialResult
from tests.attack_helpers import measurement
from tests.helpers import tiny_context

optuna.logging.set_verbosity(optuna.logging.WARNING)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Refusing(TrainTask):
    """A task whose budgets in `refused` cannot run here; every other one measures 1,000 tok/s."""

    refused: tuple[int, ...] = (1024, 3072)

    def configure(self, trial, reference):
        return TrainConfig(token_budget=trial.suggest_categorical("token_budget", [1024, 2048, 3072, 4096]))

    def refusal(self, cfg):
        return "cannot run here" if cfg.token_budget in self.refused else None

    def measure(self, cfg, **_):
        return TrialResult("ok", None, measurement(cfg))


def search(refused: tuple[int, ...], n_trials: int) -> list:
    base = tiny_context()
    task = Refusing(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)}, refused=refused)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    optimize(study, Objective(task, memory_model=False), n_trials=n_trials, timeout_s=None, callbacks=[])
    return read_trials(study)


def test_the_trials_given_are_spent_on_configurations_that_run():
    trials = search((1024, 3072), n_trials=6)
    ran = [t for t in trials if t.outcome == "ok"]
    refused = [t for t in trials if t.outcome == "unsupported"]
    assert len(ran) == 6 and refused  # the refusals came on top, recorded
    assert all("cannot run here" in t.reason for t in refused)


def test_a_space_that_runs_nothing_here_ends(caplog):
    with caplog.at_level(logging.WARNING):
        trials = search((1024, 2048, 3072, 4096), n_trials=5)
    assert len(trials) == MAX_REFUSED_IN_A_ROW and all(t.outcome == "unsupported" for t in trials)
    assert f"{MAX_REFUSED_IN_A_ROW} configurations in a row could not run here" in caplog.text
