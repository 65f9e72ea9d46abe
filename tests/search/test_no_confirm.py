"""`search --no-confirm`: the leaders are not measured again at the end (for quick looks); the
recipe is the best single run. Without it the leaders are (tests/search/test_confirm.py says which)."""

from __future__ import annotations

import json

import optuna
import pytest
from click.testing import CliRunner

from autotune.cli import main
from autotune.study.leaders import confirmation_key
from tests.attack_helpers import FAST, fake_trials

STUDY = "gpt2-tiny-cpu"


def search(tmp_path, monkeypatch, *args: str) -> tuple[optuna.Study, list]:
    monkeypatch.chdir(tmp_path)
    calls: list = []
    fake_trials(monkeypatch, calls=calls)  # the trials and the re-measurements, counted alike
    result = CliRunner().invoke(main, ["search", *FAST, "--n-trials", "3", "--no-references", *args])
    assert result.exit_code == 0, result.output
    return optuna.load_study(study_name=STUDY, storage=f"sqlite:///{tmp_path}/studies/{STUDY}.db"), calls


@pytest.mark.slow
def test_no_confirm_measures_no_leader_again_and_the_recipe_is_the_best_run(tmp_path, monkeypatch):
    study, calls = search(tmp_path, monkeypatch, "--no-confirm")
    assert len(calls) == len(study.trials) == 3
    assert not any(key.startswith(confirmation_key(0).split(":")[0]) for key in study.user_attrs)
    recipe = json.loads((tmp_path / "recipes" / f"{STUDY}.json").read_text())
    assert recipe["measured"]["tokens_per_sec"] == study.best_trial.user_attrs["tokens_per_sec"]
    assert recipe["study"]["trial"] == study.best_trial.number


def test_by_default_the_leaders_are_measured_again(tmp_path, monkeypatch):
    study, calls = search(tmp_path, monkeypatch)
    confirmed = [key for key in study.user_attrs if key.startswith(confirmation_key(0).split(":")[0])]
    assert len(calls) == len(study.trials) + len(confirmed) and confirmed


def test_every_devices_worker_is_told_not_to_confirm():
    from autotune.search.fleet import worker_command
    from tests.attack_helpers import settings

    args = dict(study="s", memory_limit_bytes=10**9, trial_timeout_s=60, n_trials=1)
    assert "--no-confirm" in worker_command(settings(confirm=False), **args)
    assert "--no-confirm" not in worker_command(settings(), **args)
