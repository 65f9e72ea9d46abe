"""A run whose loss is NaN or infinite does not train, whatever its speed (issue 14, item 6):
its outcome is `diverged`, recorded pruned, never the best, never written as a recipe."""

from __future__ import annotations

import math

import pytest
from click.testing import CliRunner
from optuna.trial import TrialState

from autotune.cli import main
from autotune.config import RunSpec, TrainConfig
from autotune.measure import outcomes
from autotune.measure.loop import measure
from autotune.study.storage import load_study
from tests.attack_helpers import FAST, in_repo_env


@pytest.mark.parametrize("loss", [math.nan, math.inf, -math.inf])
def test_a_non_finite_loss_is_diverged_whatever_the_memory(loss):
    outcome, reason = outcomes.decide_measured(100, 1000, final_loss=loss)
    assert outcome == outcomes.DIVERGED and "does not train" in reason
    assert outcomes.decide_measured(2000, 1000, final_loss=loss)[0] == outcomes.DIVERGED
    assert outcomes.decide_measured(100, 1000, final_loss=4.2) == (outcomes.OK, None)
    assert outcomes.recording(outcomes.DIVERGED, has_rate=True) is outcomes.Recording.PRUNED


@pytest.mark.slow
def test_the_measuring_loop_finds_a_nan_loss():
    spec = RunSpec(model="tests.attack_models:nan_loss", device="cpu", warmup=1, steps=2, min_time_s=0)
    m = measure(spec, TrainConfig(token_budget=1024))
    assert m.outcome == outcomes.DIVERGED and math.isnan(m.final_loss)
    assert m.tokens_per_sec > 0  # it ran, fast: speed is not what is wrong with it


@pytest.mark.process
def test_a_nan_model_is_never_the_best_nor_a_recipe(tmp_path, monkeypatch):
    """The attacker's reproduction, through `search`: the NaN model's only trial (the baseline)
    used to be `ok`, the best, and the recipe."""
    monkeypatch.chdir(tmp_path)
    in_repo_env(monkeypatch)
    args = [a if a != "gpt2-tiny" else "tests.attack_models:nan_loss" for a in FAST]
    result = CliRunner().invoke(main, ["search", *args, "--n-trials", "1"])
    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines()[-1] == (
        "Error: no trial finished a measurement with a finite loss (every run that finished diverged); "
        "no recipe written"
    )
    (trial,) = [t for t in load_study("tests.attack_models-nan_loss-cpu", None).trials if t.state != TrialState.WAITING]
    assert trial.state == TrialState.PRUNED and trial.user_attrs["outcome"] == outcomes.DIVERGED
    assert not (tmp_path / "recipes").exists()
