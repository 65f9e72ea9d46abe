"""Which knobs mattered in a study: Optuna's default importance evaluator over the trials
the sampler chose and actually ran."""

from __future__ import annotations

import json
import logging
import warnings
from dataclasses import dataclass
from typing import Iterable

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.study.record import TrialRecord

log = logging.getLogger(__name__)

# Fewer non-reference trials than this and an importance ranking is noise, not information.
MIN_IMPORTANCE_TRIALS = 4
TOP_IMPORTANCES = 3


@dataclass
class Importance:
    """Knob importances (fractions summing to 1), or why there are none."""

    values: dict[str, float] | None
    n_trials: int
    note: str | None = None

    def top(self, n: int = TOP_IMPORTANCES) -> list[tuple[str, float]]:
        return sorted((self.values or {}).items(), key=lambda kv: -kv[1])[:n]


def importance_trials(trials: Iterable[FrozenTrial]) -> list[FrozenTrial]:
    """COMPLETE trials the sampler chose (references carry no params) and that were
    run, not reused: a duplicate would count one measurement twice; a damaged one is left out
    (its readers say so)."""
    chosen = []
    for t in trials:
        record = TrialRecord.read(t)
        whole = record.damage is None and record.reference is None and record.duplicate_of is None
        if t.state == TrialState.COMPLETE and whole and t.params:
            chosen.append(t)
    return chosen


def knob_importance(study: optuna.Study) -> Importance:
    """Optuna's default importance evaluator (PED-ANOVA in Optuna 5: deterministic, needs
    no scikit-learn) over the knobs every chosen trial has and that took more than one value."""
    chosen = importance_trials(study.get_trials(deepcopy=False))
    if len(chosen) < MIN_IMPORTANCE_TRIALS:
        return Importance(None, len(chosen), f"too few trials ({len(chosen)} searched, need {MIN_IMPORTANCE_TRIALS})")
    common = set.intersection(*(set(t.params) for t in chosen))
    params = sorted(p for p in common if len({json.dumps(t.params[p]) for t in chosen}) > 1)
    if not params:
        return Importance(None, len(chosen), "no knob took more than one value")
    if len(params) == 1:
        return Importance({params[0]: 1.0}, len(chosen))
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "new study created in memory" line
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # experimental-feature notices
            scratch = optuna.create_study(direction="maximize")
            scratch.add_trials(chosen)
            values = optuna.importance.get_param_importances(scratch, params=params)
    except Exception as exc:  # an evaluator's limits (too few distinct values, ...) are not the user's error
        log.info("knob importance failed: %s", exc)
        return Importance(None, len(chosen), f"unavailable ({type(exc).__name__}: {str(exc)[:100]})")
    finally:
        optuna.logging.set_verbosity(verbosity)
    return Importance({k: float(v) for k, v in values.items()}, len(chosen))
