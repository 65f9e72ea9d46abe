"""autotune.search.run, `search` as a library call: Ctrl-C keeps the best so far, and a SQLite
study shared with a live tuner is warned about."""

from __future__ import annotations

import logging
import socket
import subprocess
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

import autotune.search.run
from autotune.recipe.recipe import Recipe
from autotune.search.references import baseline_config
from autotune.search.run import SearchInterrupted, run_search
from autotune.study.storage import open_storage
from autotune.trial.runner import TrialResult
from tests.helpers import STUDY, ok_measurement, search_settings


@pytest.mark.slow
def test_ctrl_c_records_the_trial_and_keeps_the_best_so_far(workdir, monkeypatch):
    def fake_run_trial(spec, cfg, **kwargs):
        if cfg.batching == "fixed":  # the baseline reference: measured
            return TrialResult("ok", None, ok_measurement())
        raise KeyboardInterrupt

    monkeypatch.setattr("autotune.search.training.run_trial", fake_run_trial)
    with pytest.raises(SearchInterrupted) as info:
        run_search(search_settings(n_trials=4))
    assert info.value.exit_code == 130
    trials = info.value.result.study.trials
    assert trials[0].state == TrialState.COMPLETE
    assert trials[1].state == TrialState.FAIL and trials[1].user_attrs["outcome"] == "interrupted"
    assert info.value.result.recipe_path == Path("recipes") / f"{STUDY}.json"
    assert Recipe.load(info.value.result.recipe_path).config == baseline_config(128)


@pytest.mark.process  # a stand-in for the other tuner: `sleep`
def test_sqlite_with_a_second_live_tuner_warns_and_points_elsewhere(tmp_path, caplog):
    storage = open_storage(f"sqlite:///{tmp_path / 's.db'}")
    study = optuna.create_study(study_name="s", storage=storage)
    sleeper = subprocess.Popen(["sleep", "60"])  # the other tuner, alive
    try:
        trial = study.ask()
        trial.set_user_attr("host", socket.gethostname())
        trial.set_user_attr("tuner_pid", sleeper.pid)
        with caplog.at_level(logging.WARNING):
            assert autotune.search.run.warn_if_sqlite_shared(study, f"sqlite:///{tmp_path / 's.db'}")
        assert "journal:PATH" in caplog.text and "PostgreSQL" in caplog.text and str(sleeper.pid) in caplog.text
    finally:
        sleeper.kill()
        sleeper.wait()
    caplog.clear()
    assert not autotune.search.run.warn_if_sqlite_shared(study, "sqlite:///x.db")  # its tuner is gone: no warning
