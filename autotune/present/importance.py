"""Which knobs mattered in a study: Optuna's default importance evaluator over the trials
the sampler chose and actually ran, with its spread over resamples of those trials; nothing
ranked below `MIN_IMPORTANCE_TRIALS` of them (issue D, #3: 10 noisy trials put `loss_impl` first
at 39 % while its box plots showed no effect)."""

from __future__ import annotations

import json
import logging
import random
import warnings
from dataclasses import dataclass, field
from typing import Iterable

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.study.record import TrialRecord

log = logging.getLogger(__name__)

# Fewer searched trials than this and an importance ranking is noise, not information: PED-ANOVA
# compares the top 10 % of the trials (at least two) with all of them, and ten trials' top
# two are one noisy reading apart; with 20 the resamples below still spread a knob over tens
# of percent.
MIN_IMPORTANCE_TRIALS = 20
TOP_IMPORTANCES = 3
# The spread of each importance: the evaluator over resamples of the trials (with replacement,
# seeded: the same study gives the same spread), the middle 90 % of what they give.
RESAMPLES = 20


@dataclass
class Importance:
    """Knob importances (fractions summing to 1), or why there are none."""

    values: dict[str, float] | None
    n_trials: int
    note: str | None = None
    # per knob, the middle 90 % of its importance over resamples of the trials; a knob the
    # resamples could not all rate has none
    spread: dict[str, tuple[float, float]] = field(default_factory=dict)

    def top(self, n: int = TOP_IMPORTANCES) -> list[tuple[str, float]]:
        return sorted((self.values or {}).items(), key=lambda kv: -kv[1])[:n]

    def text(self, knob: str, bracketed: bool = True) -> str:
        """ "39% (90%: 12-61%)": the importance and its spread over resamples ("39%, 90%:
        12-61%" where the caller brackets it)."""
        value = f"{100 * (self.values or {})[knob]:.0f}%"
        if knob not in self.spread:
            return value
        low, high = self.spread[knob]
        spread = f"90%: {100 * low:.0f}-{100 * high:.0f}%"
        return f"{value} ({spread})" if bracketed else f"{value}, {spread}"


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
        return Importance(
            None, len(chosen), f"too few trials ({len(chosen)}) to rank the knobs (need {MIN_IMPORTANCE_TRIALS})"
        )
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
            values = _evaluate(chosen, params)
            spread = _spread(chosen, params)
    except Exception as exc:  # an evaluator's limits (too few distinct values, ...) are not the user's error
        log.info("knob importance failed: %s", exc)
        return Importance(None, len(chosen), f"unavailable ({type(exc).__name__}: {str(exc)[:100]})")
    finally:
        optuna.logging.set_verbosity(verbosity)
    return Importance(values, len(chosen), spread=spread)


def _evaluate(trials: list[FrozenTrial], params: list[str]) -> dict[str, float]:
    scratch = optuna.create_study(direction="maximize")
    scratch.add_trials(trials)
    return {k: float(v) for k, v in optuna.importance.get_param_importances(scratch, params=params).items()}


def _spread(chosen: list[FrozenTrial], params: list[str]) -> dict[str, tuple[float, float]]:
    """Per knob, the middle 90 % of its importance over `RESAMPLES` resamples of the trials."""
    rnd = random.Random(0)
    draws: dict[str, list[float]] = {p: [] for p in params}
    for _ in range(RESAMPLES):
        sample = [rnd.choice(chosen) for _ in chosen]
        try:
            values = _evaluate(sample, params)
        except Exception:  # a resample where a knob took one value only: it rates nothing
            continue
        for p in params:
            draws[p].append(values.get(p, 0.0))
    spread = {}
    for p, got in draws.items():
        if len(got) == RESAMPLES:
            got.sort()
            cut = RESAMPLES // 20  # 5 % each side
            spread[p] = (got[cut], got[-1 - cut])
    return spread
