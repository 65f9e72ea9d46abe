"""autotune.search.objective: how each trial outcome is recorded (run_trial replaced: no
process), a repeated configuration reused, an unsupported one pruned before any process."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import optuna
import pytest
from optuna.trial import TrialState

import autotune.search.objective
import autotune.search.training
from autotune.config import TrainConfig
from autotune.measure.measurement import Measurement
from autotune.search.preflight import preflight
from autotune.study.record import read_trials
from autotune.trial.runner import TrialResult
from tests.helpers import (
    SPACES,
    TINY_PARAMS,
    nothing_written,
    ok_measurement,
    run_objective,
    search_settings,
    tiny_context,
)

MEASUREMENT = ok_measurement()


@pytest.mark.parametrize(
    "result, state, value, constraint",
    [
        # the constraint is the peak against the limit less the default 5 % headroom: 950 of 1000
        (TrialResult("ok", None, MEASUREMENT), TrialState.COMPLETE, 5000.0, -0.15),
        (
            TrialResult(
                "over_memory_limit",
                "peak above",
                dataclasses.replace(MEASUREMENT, outcome="over_memory_limit", peak_memory_bytes=1500),
            ),
            TrialState.COMPLETE,
            5000.0,
            0.55,
        ),
        (TrialResult("over_memory_limit", "stopped early"), TrialState.COMPLETE, 0.0, 1.0),  # RSS watchdog
        (TrialResult("oom", "out of memory: CUDA"), TrialState.COMPLETE, 0.0, 1.0),
        (TrialResult("unsupported", "sdpa_backend: no kernel"), TrialState.PRUNED, None, None),
        (TrialResult("crashed", "killed by SIGSEGV\ntail"), TrialState.FAIL, None, None),
        (TrialResult("timeout", "no result after 8 s"), TrialState.FAIL, None, None),
    ],
    ids=["ok", "over_limit", "over_limit_stopped", "oom", "unsupported", "crashed", "timeout"],
)
def test_objective_records_outcome(workdir, monkeypatch, result, state, value, constraint):
    monkeypatch.setattr("autotune.search.training.run_trial", lambda *a, **k: result)
    ctx = preflight(search_settings(memory_limit_bytes=1000)).task
    (trial,) = run_objective(ctx, [TINY_PARAMS]).trials
    assert trial.state == state
    assert trial.user_attrs["outcome"] == result.outcome
    assert trial.user_attrs.get("reason") == result.reason
    assert trial.value == value
    assert (trial.constraints["memory"] if trial.constraints else None) == (
        pytest.approx(constraint) if constraint is not None else None
    )
    assert (
        trial.user_attrs["config"]
        == TrainConfig(
            batching="padded", token_budget=1024, amp_dtype="float32", compile_mode="none", sdpa_backend="math"
        ).to_dict()
    )


def test_objective_reuses_a_repeated_configuration(workdir, monkeypatch):
    calls = []

    def fake_run_trial(spec, cfg, **kwargs):
        calls.append(cfg)
        return TrialResult("ok", None, MEASUREMENT)

    monkeypatch.setattr("autotune.search.training.run_trial", fake_run_trial)
    ctx = preflight(search_settings(memory_limit_bytes=1000)).task
    first, again = run_objective(ctx, [TINY_PARAMS, TINY_PARAMS]).trials
    assert len(calls) == 1
    assert again.user_attrs["duplicate_of"] == first.number
    assert again.value == first.value and again.state == TrialState.COMPLETE


def test_unsupported_is_pruned_before_any_process(workdir):
    ctx = preflight(search_settings(space=str(SPACES / "unsupported.yaml"))).task
    efficient, rule = run_objective(
        ctx, [{"token_budget": 1024, "sdpa_backend": "efficient"}, {"token_budget": 1024, "sdpa_backend": "math"}]
    ).trials
    for t in (efficient, rule):
        assert t.state == TrialState.PRUNED
        assert t.user_attrs["outcome"] == "unsupported"
        for attr in ("trial_pid", "phase_s", "wall_s", "measurement", "tokens_per_sec"):
            assert attr not in t.user_attrs  # no process was started
    assert (
        efficient.user_attrs["reason"] == "sdpa_backend: efficient attention is a CUDA kernel; on CPU use math or flash"
    )
    assert rule.user_attrs["reason"] == "this test space runs math attention only with 2048-token batches"
    assert nothing_written(workdir)


def test_a_trial_flagged_unstable_keeps_the_flag(monkeypatch):
    measurement = Measurement(
        config={}, outcome="ok", tokens_per_sec=1000.0, peak_memory_bytes=10**8, step_time_cv=0.31, unstable=True
    )
    monkeypatch.setattr(
        autotune.search.training,
        "run_trial",
        lambda *a, **k: TrialResult("ok", None, measurement, 1.0, {"total": 1.0}),
    )
    study = optuna.create_study(direction="maximize")
    study.optimize(autotune.search.objective.Objective(tiny_context()), n_trials=1)
    (trial,) = study.trials
    assert trial.state == TrialState.COMPLETE
    assert (
        trial.user_attrs["measurement"]["unstable"] is True and trial.user_attrs["measurement"]["step_time_cv"] == 0.31
    )


def test_a_combination_the_knobs_refuse_is_pruned_with_its_reason(workdir, tmp_path):
    """A trial whose drawn knobs TrainConfig itself refuses (CUDA graphs with padded batches, the
    registry's rule) is recorded unsupported with that reason, before any process: it crashed
    the search with the refusal's UsageError."""
    space = tmp_path / "graphs.yaml"
    space.write_text(
        "version: 1\nfixed: {batching: padded, num_workers: 0}\n"
        "dimensions:\n  token_budget: {choices: [1024]}\n  compile_mode: {choices: [none, reduce-overhead]}\n"
    )
    ctx = preflight(search_settings(space=str(space))).task
    (trial,) = run_objective(ctx, [{"token_budget": 1024, "compile_mode": "reduce-overhead"}]).trials
    assert trial.state == TrialState.PRUNED and trial.user_attrs["outcome"] == "unsupported"
    assert "reduce-overhead replays CUDA graphs" in trial.user_attrs["reason"]
    assert "trial_pid" not in trial.user_attrs


def test_a_configuration_proposed_to_be_measured_again_is_measured_not_reused(workdir, monkeypatch):
    """The planner proposes a configuration again when its one reading was a bad one: reusing
    that reading would record it twice, teach nothing, and the planner would ask again."""
    from autotune.search.objective import Objective
    from autotune.search.planner import EXPERT, REMEASURE, Proposal

    calls = []

    def fake_run_trial(spec, cfg, **kwargs):
        calls.append(cfg)
        return TrialResult("ok", None, MEASUREMENT)

    class Proposing(optuna.samplers.RandomSampler):  # the planner's stage for each trial, nothing else of it
        records = SimpleNamespace(read=read_trials)  # what the objective reads the study's trials through

        def proposal_for(self, number: int) -> Proposal:
            stage = (EXPERT, REMEASURE)[number]
            return Proposal(dict(TINY_PARAMS), {}, stage, "why", 1000.0, 1.0, 1, 1.0, None)

    monkeypatch.setattr("autotune.search.training.run_trial", fake_run_trial)
    monkeypatch.setattr(autotune.search.objective, "PlannerSampler", Proposing)
    ctx = preflight(search_settings(memory_limit_bytes=1000)).task
    study = optuna.create_study(direction="maximize", sampler=Proposing(seed=0))
    for params in (TINY_PARAMS, TINY_PARAMS):
        study.enqueue_trial(params)
    study.optimize(Objective(ctx), n_trials=2)
    first, again = study.trials
    assert len(calls) == 2 and "duplicate_of" not in again.user_attrs
    assert again.user_attrs["proposed_by"] == "measured_again"
