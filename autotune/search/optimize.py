"""`study.optimize` as a search runs it: a trial whose failure is its outcome (TrialFailed) is
recorded and the search goes on; so it does after a trial another worker took over
(TrialTakenOver, said in one line), within the trials and the time the search had left.

A configuration refused before any process starts (it cannot run here: `Task.refusal`) is
recorded, and the sampler learns from it, but it is not one of the trials the search was given:
those are spent on configurations that run (a generation search's TPE proposed refused ones,
issue D, #7). MAX_REFUSED_IN_A_ROW refusals in a row end the search all the same."""

from __future__ import annotations

import logging
import time
from typing import Callable

import optuna

from autotune.search.objective import Objective, TrialFailed, TrialTakenOver

log = logging.getLogger(__name__)

MAX_REFUSED_IN_A_ROW = 50


def optimize(
    study: optuna.Study,
    objective: Objective,
    *,
    n_trials: int | None,
    timeout_s: float | None,
    callbacks: list[Callable[[optuna.Study, optuna.trial.FrozenTrial], None]],
) -> None:
    """Run `objective` for up to `n_trials` trials that run (None: no limit) and `timeout_s` seconds."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    budget = _Budget(objective, n_trials)
    while not budget.spent:
        seconds = None if deadline is None else deadline - time.monotonic()
        if seconds is not None and seconds <= 0:
            return
        try:
            study.optimize(
                objective,
                n_trials=None if n_trials is None else n_trials + MAX_REFUSED_IN_A_ROW,  # `budget` stops it first
                timeout=seconds,
                catch=(TrialFailed,),
                callbacks=[budget.count, *callbacks],
                gc_after_trial=False,
            )
            return  # stopped: its budget spent, by a callback (the stop rule), or the time
        except TrialTakenOver as taken:
            log.warning("%s", taken)
            budget.ran += 1  # it ran: one of the trials given, though another worker took it
            budget.spent = n_trials is not None and budget.ran >= n_trials


class _Budget:
    """Counts the trials that ran (not refused) and stops the study when `n_trials` did, or after
    MAX_REFUSED_IN_A_ROW refusals in a row (a space that runs nothing here)."""

    def __init__(self, objective: Objective, n_trials: int | None) -> None:
        self.objective, self.n_trials = objective, n_trials
        self.ran = self.refused_in_a_row = 0
        self.refused = objective.refused
        self.spent = n_trials is not None and n_trials <= 0

    def count(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if self.objective.refused > self.refused:
            self.refused, self.refused_in_a_row = self.objective.refused, self.refused_in_a_row + 1
        else:
            self.ran, self.refused_in_a_row = self.ran + 1, 0
        if self.n_trials is not None and self.ran >= self.n_trials:
            self.spent = True
            study.stop()
        elif self.refused_in_a_row >= MAX_REFUSED_IN_A_ROW:
            log.warning("%d configurations in a row could not run here: the search stops", self.refused_in_a_row)
            self.spent = True
            study.stop()
