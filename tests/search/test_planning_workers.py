"""Two workers proposing at once (issue D, P03: two tuners started a second apart on one study
both ran the expert prior, #0 and #1 identical, and neither warned). A proposal waits until every
trial begun before it says what it runs, then proposes something else."""

from __future__ import annotations

import optuna

import autotune.search.sampler as sampler_module
from autotune.search.sampler import PLANNING_WAIT_S, study_sampler
from autotune.space.sampling import suggest
from autotune.study import record
from autotune.study.storage import internals
from tests.helpers import tiny_context

optuna.logging.set_verbosity(optuna.logging.WARNING)


def expert_prior() -> dict:
    study = optuna.create_study(direction="maximize", sampler=study_sampler(tiny_context(), 0))
    trial = study.ask()
    return study.sampler.proposal_for(trial.number).params


def test_a_proposal_waits_for_the_trial_another_worker_is_still_planning(monkeypatch):
    first = expert_prior()
    study = optuna.create_study(direction="maximize", sampler=study_sampler(tiny_context(), 0))
    storage, study_id = internals(study)
    planning = storage.create_new_trial(study_id)  # another worker's trial: RUNNING, no configuration yet
    waits = []

    def pause(seconds: float) -> None:  # the other worker's planner finishes while this one waits
        waits.append(seconds)
        if len(waits) == 3:
            config = suggest(tiny_context().space, optuna.trial.FixedTrial(first)).to_dict()
            storage.set_trial_user_attr(planning, record.CONFIG, config)

    monkeypatch.setattr(sampler_module, "_pause", pause)
    trial = study.ask()
    assert len(waits) == 3  # it waited for the configuration, then planned
    assert study.sampler.proposal_for(trial.number).params != first


def test_a_worker_gone_mid_plan_delays_a_proposal_only_so_long(monkeypatch):
    study = optuna.create_study(direction="maximize", sampler=study_sampler(tiny_context(), 0))
    storage, study_id = internals(study)
    storage.create_new_trial(study_id)  # never says what it runs
    clock = [0.0]
    monkeypatch.setattr(sampler_module.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(sampler_module, "_pause", lambda s: clock.__setitem__(0, clock[0] + s))
    trial = study.ask()
    assert study.sampler.proposal_for(trial.number) is not None
    assert PLANNING_WAIT_S <= clock[0] <= PLANNING_WAIT_S + 0.2
