"""`search --objective tokens_per_joule`: refused where the device has no energy counter; a
resumed study keeps its objective; the trial's value is its tokens per joule."""

from __future__ import annotations

import dataclasses

import optuna
import pytest

from autotune.config import TrainConfig
from autotune.errors import UsageError
from autotune.measure.measurement import Measurement
from autotune.search.settings import SearchSettings
from autotune.search.task import resume
from tests.attack_helpers import refused
from tests.helpers import tiny_context


def test_tokens_per_joule_is_refused_in_one_line_without_an_energy_counter(tmp_path, monkeypatch):
    monkeypatch.setattr("autotune.measure.energy.POWERCAP", tmp_path / "no-powercap")
    err = refused(
        tmp_path, monkeypatch, "search", "--model", "gpt2-tiny", "--device", "cpu", "--objective", "tokens_per_joule"
    )
    assert "--objective tokens_per_joule needs an energy counter" in err and "no RAPL on this machine" in err


def test_a_resumed_study_keeps_its_objective():
    ctx = tiny_context()
    study = optuna.create_study(direction="maximize")
    study.set_user_attr("objective", "tokens_per_joule")
    assert resume(study, ctx, SearchSettings()).objective == "tokens_per_joule"
    with pytest.raises(UsageError, match="maximizes tokens_per_joule, this run asks for tokens_per_sec"):
        resume(study, ctx, SearchSettings(objective="tokens_per_sec"))


def test_the_trial_value_is_tokens_per_joule(monkeypatch):
    from autotune.search.objective import Objective
    from autotune.trial.runner import TrialResult

    ctx = dataclasses.replace(tiny_context(), objective="tokens_per_joule")

    def run_trial(spec, cfg, **kwargs):
        m = Measurement(config=cfg.to_dict(), outcome="ok", tokens_per_sec=5000.0, peak_memory_bytes=800)
        m.joules_per_token = 0.002
        return TrialResult("ok", None, m)

    monkeypatch.setattr("autotune.search.training.run_trial", run_trial)
    study = optuna.create_study(direction="maximize")
    study.optimize(Objective(ctx), n_trials=1)
    assert study.trials[0].value == pytest.approx(500.0)  # 1 / 0.002 J per token
    assert study.trials[0].user_attrs["joules_per_token"] == 0.002


def test_under_tokens_per_joule_no_trial_stops_at_a_short_window(monkeypatch):
    """A short first window is judged on tokens/s and is too short for an energy figure (the
    trial would then fail for want of one): under tokens_per_joule every trial is timed in full."""
    from autotune.search.objective import Objective
    from autotune.trial.runner import TrialResult

    specs = []

    def run_trial(spec, cfg, **kwargs):
        specs.append(spec)
        m = Measurement(config=cfg.to_dict(), outcome="ok", tokens_per_sec=5000.0, peak_memory_bytes=800)
        m.joules_per_token = 0.002
        return TrialResult("ok", None, m)

    monkeypatch.setattr("autotune.search.training.run_trial", run_trial)
    for objective in ("tokens_per_joule", "tokens_per_sec"):
        ctx = dataclasses.replace(tiny_context(), objective=objective)
        run = Objective(ctx)
        run.prune_below = 4000.0  # what the planner asks of a trial once there is a best
        run._run(optuna.create_study().ask(), TrainConfig())
    assert [s.prune_below_tokens_per_sec for s in specs] == [None, 4000.0]
