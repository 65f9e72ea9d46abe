"""`study.optimize` as a search runs it: a trial whose failure is its outcome (TrialFailed) is
recorded and the search goes on; so it does after a trial another worker took over
(TrialTakenOver, said in one line), within the trials and the time the search had left."""

from __future__ import annotations

import logging
import time
from typing import Callable

import optuna

from autotune.search.objective import Objective, TrialFailed, TrialTakenOver

log = logging.getLogger(__name__)


def optimize(
    study: optuna.Study,
    objective: Objective,
    *,
    n_trials: int | None,
    timeout_s: float | None,
    callbacks: list[Callable[[optuna.Study, optuna.trial.FrozenTrial], None]],
) -> None:
    """Run `objective` for up to `n_trials` trials (None: no limit) and `timeout_s` seconds."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    begun = objective.calls
    while True:
        left = None if n_trials is None else n_trials - (objective.calls - begun)
        seconds = None if deadline is None else deadline - time.monotonic()
        if (left is not None and left <= 0) or (seconds is not None and seconds <= 0):
            return
        try:
            study.optimize(
                objective,
                n_trials=left,
                timeout=seconds,
                catch=(TrialFailed,),
                callbacks=callbacks,
                gc_after_trial=False,
            )
            return
        except TrialTakenOver as taken:
            log.warning("%s", taken)
