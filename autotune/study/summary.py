"""A study read back: its best (the winner among the leaders), its reference trials, its
outcome counts and the speedups, every trial a typed record (`study.record`). What `show`,
`compare`, `report`, the search's summary and the recipe say of a study comes from here, so
they cannot disagree. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import optuna

from autotune.measure import outcomes
from autotune.study import leaders as leaders_
from autotune.study.record import OVER_BOUND, TrialRecord, read_trials
from autotune.study.references import BASELINE, CHECKLIST, INFEASIBLE, UNSTABLE
from autotune.study.study_record import StudyRecord


@dataclass
class StudySummary:
    name: str
    best: TrialRecord | None
    baseline: TrialRecord | None
    checklist: TrialRecord | None
    counts: dict[str, int] = field(default_factory=dict)
    trials: list[TrialRecord] = field(default_factory=list)
    # The top distinct configurations and their re-measurements (`search.confirm`): `best` is
    # the winner among them, which is not always the best single run.
    leaders: list[leaders_.Candidate] = field(default_factory=list)
    # A study of several ranks: the best measured again on one rank (`search.scaling`), when it was
    single_rank: dict[str, Any] | None = None
    about: StudyRecord = field(default_factory=StudyRecord)  # what the study is: its model, hardware, rules

    @property
    def world_size(self) -> int:
        m = self.best.measurement if self.best else None
        return m.world_size if m is not None else 1

    @property
    def scaling_efficiency(self) -> float | None:
        """The best's global tokens/s over N x its single-rank reference's (None without one)."""
        ref = self.single_rank
        if self.best is None or not self.best.figure or not ref or ref.get("trial") != self.best.number:
            return None
        single = ref.get("tokens_per_sec")
        return self.best.figure / (self.world_size * single) if single else None

    def speedup(self, reference: TrialRecord | None) -> float | None:
        """The best's figure (the mean of its runs, as the recipe records it) over a reference's."""
        if self.best is None or reference is None or not reference.figure:
            return None
        return self.best.figure / reference.figure

    def speedup_flags(self, reference: TrialRecord | None) -> list[str]:
        """What makes the speedup over `reference` less than its figure says (none when there
        is no speedup): UNSTABLE, its step times varied beyond the target even over a second
        window, so its rate (and a ratio over it) is unsure; INFEASIBLE, it broke the memory
        limit, so it is a run nobody could train with."""
        if self.speedup(reference) is None:
            return []
        assert reference is not None
        return [flag for flag, holds in ((UNSTABLE, reference.unstable), (INFEASIBLE, not reference.feasible)) if holds]

    def trial(self, number: int) -> TrialRecord | None:
        return next((t for t in self.trials if t.number == number), None)

    @property
    def feasible(self) -> list[TrialRecord]:
        return [t for t in self.trials if t.feasible]

    @property
    def no_best_reason(self) -> str:
        """Why there is no best: the study has no trials; every trial that ran ok broke a latency
        bound (a generation study's: the bound is the cause, not memory); every trial that got as
        far as memory broke the limit; every run that finished did not train (diverged); or no
        trial got that far (all crashed, timed out or unsupported: the limit is not the cause)."""
        if not self.trials:
            return "the study has no trials yet"
        over = [t for t in self.trials if t.status == OVER_BOUND]
        if over:  # ran ok, within the memory limit, but over a generation study's latency bound
            bounds = sorted({option for t in over for option in t.broken_bounds})
            them = "it" if len(bounds) == 1 else "them"
            return f"no trial meets {' and '.join(bounds)}: the {len(over)} trial(s) that ran ok are over {them}"
        measured = sum(self.counts.get(o, 0) for o in (*outcomes.MEASURED, *outcomes.INFEASIBLE))
        if measured:
            return "no trial fits the memory limit"
        if self.counts.get(outcomes.DIVERGED):
            return "no trial finished a measurement with a finite loss (every run that finished diverged)"
        return "no trial finished a measurement"


def summarize(study: optuna.Study) -> StudySummary:
    attrs = study.user_attrs
    return summarize_records(study.study_name, read_trials(study, attrs), attrs)


def summarize_records(name: str, records: list[TrialRecord], attrs: Mapping[str, Any]) -> StudySummary:
    """A study's summary from its records and attrs, read already (or known otherwise: a search
    whose storage stopped answering, `search.salvage`)."""
    feasible = [r for r in records if r.feasible]
    about = StudyRecord.read(attrs)
    leaders = leaders_.study_leaders(feasible, about.objective)
    chosen = leaders_.winner(leaders)
    best = next(r for r in feasible if r.number == chosen.number) if chosen else None
    counts: dict[str, int] = {}
    for r in records:
        counts[r.status] = counts.get(r.status, 0) + 1  # outcomes; over_bound; running, waiting

    def reference(which: str) -> TrialRecord | None:
        # measured: ok, or over the limit with a rate (not one the RSS watchdog stopped early)
        done = [r for r in records if r.reference == which and r.measured]
        return done[0] if done else None

    single = attrs.get("single_rank_reference")
    return StudySummary(
        name,
        best,
        reference(BASELINE),
        reference(CHECKLIST),
        counts,
        records,
        leaders,
        single_rank=single if isinstance(single, dict) else None,
        about=about,
    )
