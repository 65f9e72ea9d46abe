"""autotune.study.lifecycle: workers opening one new study at once create it and its references
once, get their own sampler seeds, finish a dead creator's set-up; a dead tuner's trial is
failed and retried once; the summary's references."""

from __future__ import annotations

import socket
import subprocess

import optuna
import pytest
from optuna.trial import TrialState

import autotune.search.run
import autotune.study.lifecycle
from autotune.config import TrainConfig
from autotune.measure import outcomes
from autotune.search.references import enqueue_references
from autotune.study.storage import open_storage
from autotune.study.summary import summarize
from tests.helpers import (
    load,
    run_together,
    tiny_context,
)


def open_reference_study(name, storage, ctx):
    """Open a study as `search` does: the tuner's sampler, the references enqueued at creation."""
    return autotune.study.lifecycle.open_study(
        name,
        storage,
        ctx,
        sampler=ctx.sampler,
        seed=0,
        on_create=enqueue_references,
    )


@pytest.mark.parametrize("backend", ["journal", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_concurrent_workers_create_the_study_and_its_references_once(backend, request, tmp_path):
    """The race itself, without trials: four workers opening a new study at the same moment.
    Exactly one creates it; the reference trials are enqueued once; the others wait for it to
    be ready and agree on its identity."""
    ctx = tiny_context()
    url = (
        f"journal:{tmp_path / 'race.journal'}"
        if backend == "journal"
        else request.getfixturevalue("postgres").fresh_database()
    )
    results: list = []
    errors = run_together(4, lambda: results.append(open_reference_study("race", open_storage(url), ctx)))
    assert not errors, errors
    assert sorted(is_new for _, is_new in results) == [False, False, False, True]
    study = load(url, "race")
    waiting = study.get_trials(states=(TrialState.WAITING,))
    assert sorted(t.user_attrs["reference"] for t in waiting) == ["baseline", "checklist"]
    assert study.user_attrs["identity"] == ctx.identity()


def test_workers_joining_together_get_their_own_sampler_seed():
    """Same seed, same number of trials, two processes: different seeds, or the two workers
    would propose the same configurations in lockstep. A resume gets a new one too."""
    assert autotune.study.lifecycle.worker_seed(0, 2, pid=1001) != autotune.study.lifecycle.worker_seed(0, 2, pid=1002)
    assert autotune.study.lifecycle.worker_seed(0, 2, pid=1001) != autotune.study.lifecycle.worker_seed(0, 3, pid=1001)


@pytest.mark.slow
def test_a_study_whose_creator_died_before_setting_it_up_is_set_up_by_the_next_worker(tmp_path, monkeypatch):
    monkeypatch.setattr(autotune.study.lifecycle, "JOIN_WAIT_S", 0.5)
    storage = open_storage(f"journal:{tmp_path / 's.journal'}")
    optuna.create_study(study_name="half", storage=storage, direction="maximize")  # and then the creator died
    study, is_new = open_reference_study("half", storage, tiny_context())
    assert is_new and len(study.get_trials(states=(TrialState.WAITING,))) == 2


@pytest.mark.process  # two stand-in tuners: `true` (dead) and `sleep` (alive)
def test_orphaned_trial_of_a_dead_tuner_is_failed_at_resume_and_retried_once(tmp_path):
    """On one host, without waiting for any heartbeat: the tuner's pid is gone, so its
    RUNNING trial is failed and queued again; a live tuner's trial is left alone."""
    study = optuna.create_study(study_name="o", storage=open_storage(f"journal:{tmp_path / 'o.journal'}"))
    dead = subprocess.Popen(["true"])
    dead.wait()
    alive = subprocess.Popen(["sleep", "60"])
    try:
        for pid in (dead.pid, alive.pid):
            t = study.ask({"x": optuna.distributions.CategoricalDistribution([1, 2])})
            for key, value in {"host": socket.gethostname(), "tuner_pid": pid, "trial_pid": 1, "config": {}}.items():
                t.set_user_attr(key, value)
        assert autotune.search.run.fail_orphaned_trials(study) == [0]
        trials = study.get_trials()
        assert trials[0].state == TrialState.FAIL and trials[0].user_attrs["outcome"] == outcomes.INTERRUPTED
        assert trials[1].state == TrialState.RUNNING  # its tuner is alive: not ours to touch
        (retry,) = study.get_trials(states=(TrialState.WAITING,))
        assert retry.params == trials[0].params and retry.system_attrs["failed_trial"] == 0
        # The retry does not inherit the dead attempt's host and pids (it would look orphaned).
        assert "tuner_pid" not in retry.user_attrs and "trial_pid" not in retry.user_attrs
        assert autotune.search.run.fail_orphaned_trials(study) == []  # idempotent
    finally:
        alive.kill()
        alive.wait()


def test_a_reference_stopped_early_has_no_rate_and_is_not_a_reference_figure():
    """A reference trial the RSS watchdog stopped (over_memory_limit, no tokens/s) cannot
    anchor a speedup; the summary then has no such reference rather than a None rate."""
    study = optuna.create_study(direction="maximize")
    config = {"config": TrainConfig().to_dict()}  # a measured trial without one is damaged (skipped)
    for reference, attrs in (
        ("baseline", {"outcome": "ok", "tokens_per_sec": 100.0}),
        ("checklist", {"outcome": "over_memory_limit"}),
    ):
        study.add_trial(
            optuna.trial.create_trial(
                value=attrs.get("tokens_per_sec", 0.0), user_attrs={"reference": reference, **config, **attrs}
            )
        )
    summary = summarize(study)
    assert summary.baseline is not None and summary.checklist is None
