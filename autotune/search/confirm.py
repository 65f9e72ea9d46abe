"""Confirming the winner before it becomes a recipe: the leaders the rule asks for
(`study.leaders`, which says why and how the winner is chosen) are measured once more, each in
a fresh process, once per study."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from autotune.measure.outcomes import Outcome
from autotune.study.leaders import Candidate, to_remeasure
from autotune.study.record import Confirmation, confirmation_key, read_trials

if TYPE_CHECKING:
    import optuna

    from autotune.search.task import Task


def confirm_leaders(study: "optuna.Study", top: Sequence[Candidate], task: "Task", reporter=None) -> list[int]:
    """Re-measure the leaders (`StudySummary.leaders`) the rule asks for, each in a fresh
    process, once per study (kept as study attrs: a resumed study does not measure the same
    trial again). Returns the trials re-measured now."""
    trials = {t.number: t for t in read_trials(study)}
    done = []
    pending = [c for c in to_remeasure(top) if confirmation_key(c.number) not in study.user_attrs]
    for index, candidate in enumerate(pending, 1):
        if reporter is not None:  # run k of n: the progress display estimates what is left from it
            reporter.confirming(candidate.number, index, len(pending))
        result = task.measure(task.config_type.from_dict(trials[candidate.number].config))
        m = result.measurement
        confirmation = Confirmation(
            Outcome.read(result.outcome),
            result.tokens_per_sec,
            m.tokens_per_sec_ci95 if m else None,
            m.joules_per_token if m else None,
            result.peak_memory_bytes,
        )
        study.set_user_attr(confirmation_key(candidate.number), confirmation.to_dict())
        done.append(candidate.number)
    return done
