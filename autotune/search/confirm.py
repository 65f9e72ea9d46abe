"""Confirming the winner before it becomes a recipe: the leaders the rule asks for
(`study.leaders`, which says why and how the winner is chosen) are measured once more, each in
a fresh process, once per study; then any trial whose one run stands above the winner's mean;
then, on a GPU, the two best while they are near-tied (`study.leaders.tied`)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Sequence

from autotune.measure.outcomes import Outcome
from autotune.search.planner import measurement_noise
from autotune.study.leaders import DEFAULT_OBJECTIVE, LEADERS, READINGS, Candidate, challenger, tied, to_remeasure
from autotune.study.record import Confirmation, confirmation_key, read_trials
from autotune.study.summary import summarize

if TYPE_CHECKING:
    import optuna

    from autotune.search.task import Task
    from autotune.study.record import TrialRecord


def confirm_leaders(study: "optuna.Study", top: Sequence[Candidate], task: "Task", reporter=None) -> list[int]:
    """Re-measure the leaders (`StudySummary.leaders`) the rule asks for, each in a fresh
    process, once per study (kept as study attrs: a resumed study does not measure the same
    trial again); then each challenger (`study.leaders.challenger`), at most LEADERS of them.
    Returns the trials re-measured now."""
    trials = {t.number: t for t in read_trials(study)}
    done = []
    pending = [c for c in to_remeasure(top) if confirmation_key(c.number) not in study.user_attrs]
    for index, candidate in enumerate(pending, 1):
        if reporter is not None:  # run k of n: the progress display estimates what is left from it
            reporter.confirming(candidate.number, index, len(pending))
        _remeasure(study, trials[candidate.number], task)
        done.append(candidate.number)
    for _ in range(LEADERS):
        summary = summarize(study)
        candidate = challenger([r for r in summary.trials if r.feasible], summary.about.objective)
        if candidate is None:
            break
        if reporter is not None:
            reporter.confirming(candidate.number, len(done) + 1, len(done) + 1)
        _remeasure(study, trials[candidate.number], task)
        done.append(candidate.number)
    summary = summarize(study)
    if summary.about.objective != DEFAULT_OBJECTIVE:  # further runs read tokens/s: energy keeps two
        return done
    noise = measurement_noise(task.device.kind)
    for _ in range(2 * READINGS):  # each round adds a run to one of the two, at most READINGS each
        pair = tied(summary.leaders, noise)
        if not pair:
            break
        for candidate in pair:
            if reporter is not None:
                reporter.confirming(candidate.number, len(done) + 1, len(done) + 1)
            if not _measure_again(study, trials[candidate.number], task):
                return done + [candidate.number]  # a run that ended otherwise than ok: the means stand
            done.append(candidate.number)
        summary = summarize(study)
    return done


def _measure_again(study: "optuna.Study", trial: "TrialRecord", task: "Task") -> bool:
    """One more run of a near-tied leader (`study.leaders.tied`), its tokens/s added to its
    confirmation's further readings. False when the run ended otherwise than ok."""
    result = task.measure(task.config_type.from_dict(trial.config))
    if Outcome.read(result.outcome) is not Outcome.OK or not result.tokens_per_sec:
        return False
    key = confirmation_key(trial.number)
    confirmation = Confirmation.read(study.user_attrs.get(key))
    again = (*confirmation.again, float(result.tokens_per_sec))
    study.set_user_attr(key, replace(confirmation, again=again).to_dict())
    return True


def _remeasure(study: "optuna.Study", trial: "TrialRecord", task: "Task") -> None:
    """`trial`'s configuration measured once more in a fresh process, kept as its confirmation."""
    result = task.measure(task.config_type.from_dict(trial.config))
    m = result.measurement
    confirmation = Confirmation(
        Outcome.read(result.outcome),
        result.tokens_per_sec,
        m.tokens_per_sec_ci95 if m else None,
        m.joules_per_token if m else None,
        result.peak_memory_bytes,
    )
    study.set_user_attr(confirmation_key(trial.number), confirmation.to_dict())
