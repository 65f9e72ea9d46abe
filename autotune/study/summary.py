"""A study read back: its best (the winner among the leaders), its reference trials, its
outcome counts, and the speedups. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass, field

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.measure import outcomes
from autotune.measure.measurement import Measurement
from autotune.study import leaders as leaders_
from autotune.study.references import BASELINE, CHECKLIST


@dataclass
class StudySummary:
    name: str
    best: FrozenTrial | None
    baseline: FrozenTrial | None
    checklist: FrozenTrial | None
    counts: dict[str, int] = field(default_factory=dict)
    trials: list[FrozenTrial] = field(default_factory=list)
    # The top distinct configurations and their re-measurements (`search.confirm`): `best` is
    # the winner among them, which is not always the best single run.
    leaders: list[leaders_.Candidate] = field(default_factory=list)

    def speedup(self, reference: FrozenTrial | None) -> float | None:
        if self.best is None or reference is None:
            return None
        ref = tokens_per_sec(reference)
        return tokens_per_sec(self.best) / ref if ref else None

    @property
    def no_best_reason(self) -> str:
        """Why there is no best: the study has no trials; every trial that got as far as memory
        broke the limit; every run that finished did not train (diverged); or no trial got that
        far (all crashed, timed out or unsupported: the limit is not the cause)."""
        if not self.trials:
            return "the study has no trials yet"
        measured = sum(self.counts.get(o, 0) for o in (*outcomes.MEASURED, *outcomes.INFEASIBLE))
        if measured:
            return "no trial fits the memory limit"
        if self.counts.get(outcomes.DIVERGED):
            return "no trial finished a measurement with a finite loss (every run that finished diverged)"
        return "no trial finished a measurement"


def tokens_per_sec(trial: FrozenTrial) -> float | None:
    return trial.user_attrs.get("tokens_per_sec")


def trial_measurement(trial: FrozenTrial) -> Measurement | None:
    """The trial's measurement, typed again (stored as a JSON user attr); None if it has none."""
    stored = trial.user_attrs.get("measurement")
    if not stored:
        return None
    # What the trial itself records stands in for keys an older or partial record lacks.
    known = {"config": trial.user_attrs.get("config") or {}, "outcome": trial.user_attrs.get("outcome") or "unknown"}
    return Measurement.from_dict({**known, **stored})


def is_feasible_ok(trial: FrozenTrial) -> bool:
    return (
        trial.state == TrialState.COMPLETE
        and trial.user_attrs.get("outcome") == outcomes.OK
        and all(v <= 0 for v in (trial.constraints or {}).values())
    )


def summarize(study: optuna.Study) -> StudySummary:
    trials = study.get_trials(deepcopy=False)
    feasible = [t for t in trials if is_feasible_ok(t)]
    leaders = leaders_.study_leaders(feasible, study.user_attrs)
    chosen = leaders_.winner(leaders)
    best = next(t for t in feasible if t.number == chosen.number) if chosen else None
    counts: dict[str, int] = {}
    for t in trials:
        outcome = t.user_attrs.get("outcome") or ("running" if t.state == TrialState.RUNNING else t.state.name.lower())
        counts[outcome] = counts.get(outcome, 0) + 1

    def reference(name: str) -> FrozenTrial | None:
        # measured: ok, or over the limit with a rate (not one the RSS watchdog stopped early)
        done = [
            t
            for t in trials
            if t.user_attrs.get("reference") == name
            and t.user_attrs.get("outcome") in outcomes.MEASURED
            and tokens_per_sec(t) is not None
        ]
        return done[0] if done else None

    return StudySummary(study.study_name, best, reference(BASELINE), reference(CHECKLIST), counts, trials, leaders)
