"""autotune.search.memory_model: a peak predicted from a study's own trials, on constructed
observations; and in the objective, a configuration predicted over the limit is never run and
never the best."""

from __future__ import annotations

import dataclasses

import optuna
import pytest
from optuna.trial import TrialState, create_trial

from autotune.config import TrainConfig
from autotune.measure import outcomes
from autotune.search.memory_model import (
    CLEAR_MARGIN,
    HOST_ONLY_KNOBS,
    MemoryObservation,
    observations_from_trials,
    predict_peak,
)
from autotune.search.objective import Objective, TrialFailed
from autotune.study.summary import summarize
from autotune.trial.runner import TrialResult
from tests.helpers import ok_measurement, tiny_context

MiB = 2**20
LIMIT = 1000 * MiB


def knobs(budget: int, **changes) -> dict:
    return TrainConfig(token_budget=budget, **changes).to_dict()


def seen(budget: int, peak_mib: int | None, *, over: bool = False, trial: int | None = None, **changes):
    return MemoryObservation(knobs(budget, **changes), None if peak_mib is None else peak_mib * MiB, over, trial)


def test_two_budgets_extrapolate_linearly_and_name_their_trials():
    # about 199 MiB fixed + 0.1 MiB per token: 8192 tokens -> 1021 MiB, 16384 -> 1842 MiB
    obs = [seen(1024, 302, trial=3), seen(4096, 610, trial=7)]
    far = predict_peak(obs, knobs(16384), LIMIT)
    assert far.over_limit_by_clear_margin and not far.lower_bound
    assert far.peak_bytes == pytest.approx(1842 * MiB, rel=1e-3)
    assert far.trials == (3, 7) and "#3" in far.basis and "#7" in far.basis and "linear fit" in far.basis
    assert far.constraint(LIMIT) == pytest.approx(0.842, rel=1e-2)
    near = predict_peak(obs, knobs(8192), LIMIT)  # over the limit by 2 %: within the margin, so it runs
    assert near.peak_bytes > LIMIT and not near.over_limit_by_clear_margin
    assert not predict_peak(obs, knobs(2048), LIMIT).over_limit_by_clear_margin


def test_the_margin_is_ten_percent():
    obs = [seen(1000, 100), seen(2000, 200)]  # 0.1 MiB per token, nothing fixed
    assert CLEAR_MARGIN == 0.10
    assert not predict_peak(obs, knobs(10900), LIMIT).over_limit_by_clear_margin  # 1090 MiB: 9 % over
    assert predict_peak(obs, knobs(11100), LIMIT).over_limit_by_clear_margin  # 1110 MiB: 11 % over


def test_an_oom_bounds_every_larger_budget_of_its_family_and_nothing_else():
    obs = [seen(4096, None, over=True, trial=5)]
    bigger = predict_peak(obs, knobs(8192), LIMIT)
    assert bigger.over_limit_by_clear_margin and bigger.lower_bound and bigger.from_oom
    assert bigger.peak_bytes > LIMIT and "#5" in bigger.basis and "out of memory" in bigger.basis
    # how far over is unknown: the constraint an OOM trial records
    assert bigger.constraint(LIMIT) == outcomes.UNKNOWN_EXCESS
    assert predict_peak(obs, knobs(2048), LIMIT) is None  # a smaller budget may fit
    assert predict_peak(obs, knobs(8192, amp_dtype="bfloat16"), LIMIT) is None  # another family


def test_a_measured_over_limit_peak_needs_no_margin():
    # the fit says 1007 MiB at 2500 tokens, within the margin; a trial at 2048 measured over the limit
    obs = [seen(1024, 1000), seen(2048, 1005, over=True, trial=9)]
    p = predict_peak(obs, knobs(2500), LIMIT)
    assert p.over_limit_by_clear_margin and not p.from_oom
    assert p.peak_bytes == pytest.approx(1007.2 * MiB, rel=1e-3) and "#9 at token_budget 2048" in p.basis
    assert p.constraint(LIMIT) == pytest.approx(0.0072, rel=1e-2)
    # an over-limit trial with no fit: its peak bounds the prediction
    alone = predict_peak([seen(2048, 1005, over=True, trial=9)], knobs(2500), LIMIT)
    assert alone.lower_bound and alone.peak_bytes == 1005 * MiB and alone.trials == (9,)


def test_one_point_under_the_limit_or_no_family_is_no_basis():
    assert predict_peak([seen(1024, 300)], knobs(16384), LIMIT) is None
    assert predict_peak([], knobs(16384), LIMIT) is None
    assert predict_peak([seen(1024, 300), seen(2048, 400)], knobs(16384, sdpa_backend="flash"), LIMIT) is None


def test_memory_never_falls_with_the_budget():
    # a noisy negative slope is held at zero, and a peak measured at a smaller budget is a floor
    p = predict_peak([seen(1024, 900), seen(2048, 700)], knobs(4096), LIMIT)
    assert p.peak_bytes >= 900 * MiB


def test_host_only_knobs_join_families_on_a_gpu_only():
    obs = [seen(1024, 302, num_workers=4, pin_memory=True), seen(4096, 610, num_workers=4, pin_memory=True)]
    assert predict_peak(obs, knobs(16384), LIMIT) is None  # CPU: workers count in the limit
    assert predict_peak(obs, knobs(16384), LIMIT, ignore=HOST_ONLY_KNOBS).over_limit_by_clear_margin


def _trial(number: int, outcome: str, config: dict, peak: int | None = None, **attrs) -> optuna.trial.FrozenTrial:
    user = {"outcome": outcome, "config": config, **attrs}
    if peak is not None:
        user["peak_memory_bytes"] = peak
    state = TrialState.PRUNED if outcome in (outcomes.UNSUPPORTED, outcomes.DIVERGED) else TrialState.COMPLETE
    t = create_trial(state=state, value=0.0 if state == TrialState.COMPLETE else None, user_attrs=user)
    t.number = number
    return t


def test_observations_come_from_facts_only():
    trials = [
        _trial(0, outcomes.OK, knobs(1024), 300),
        _trial(1, outcomes.OOM, knobs(8192)),
        _trial(2, outcomes.OVER_MEMORY_LIMIT, knobs(4096), 1200),
        _trial(3, outcomes.DIVERGED, knobs(2048), 400),  # its speed is no answer; its memory is real
        _trial(4, outcomes.PREDICTED_OVER_LIMIT, knobs(16384), predicted_peak_memory_bytes=5000),
        _trial(5, outcomes.OK, knobs(1024), 300, duplicate_of=0),
        _trial(6, outcomes.UNSUPPORTED, knobs(1024, sdpa_backend="flash")),
    ]
    found = {o.trial: o for o in observations_from_trials(trials)}
    assert sorted(found) == [0, 1, 2, 3]
    assert found[1] == MemoryObservation(knobs(8192), None, True, 1)
    assert found[2].over_limit and found[2].peak_bytes == 1200
    assert not found[0].over_limit and not found[3].over_limit


# --- in the objective --------------------------------------------------------------------------


def _one_family(monkeypatch, peaks: dict[int, int]) -> tuple:
    """gpt2-tiny's context (limit 2 GiB, headroom 5 %) on budgets 1024-4096; a trial of budget B
    "measures" peaks[B] without a process. Returns (ctx, the family's other knobs, budgets run)."""
    ctx = tiny_context()
    ctx = dataclasses.replace(ctx, space=_with_budgets(ctx.space, (1024, 2048, 4096)))
    ran: list[int] = []

    def fake_run_trial(spec, cfg, **kwargs):
        ran.append(cfg.token_budget)
        return TrialResult("ok", None, dataclasses.replace(ok_measurement(), peak_memory_bytes=peaks[cfg.token_budget]))

    monkeypatch.setattr("autotune.search.objective.run_trial", fake_run_trial)
    base = {"amp_dtype": "float32", "compile_mode": "none", "sdpa_backend": "math", "num_workers": 0}
    base["checkpoint_count"] = 0
    return ctx, base, ran


def test_a_configuration_predicted_over_the_limit_is_never_run_nor_best(monkeypatch):
    """Two measured budgets of one family; the next, larger budget of that family is predicted
    far over the limit: no process, recorded with its prediction, infeasible, and never the best
    although its value and a later ok trial are compared."""
    peaks = {1024: 600 * MiB, 2048: 1400 * MiB}  # 0.78 MiB per token: 4096 -> about 3 GiB
    ctx, base, ran = _one_family(monkeypatch, peaks)
    study = optuna.create_study(direction="maximize")
    for budget in (1024, 2048):
        study.enqueue_trial({**base, "token_budget": budget})
    study.optimize(Objective(ctx), n_trials=2, catch=(TrialFailed,))
    skipped_params = {**base, "token_budget": 4096}
    study.enqueue_trial(skipped_params)
    study.optimize(Objective(ctx), n_trials=1, catch=(TrialFailed,))

    skipped = study.trials[-1]
    assert ran == [1024, 2048]  # the third never started a process
    assert skipped.state == TrialState.COMPLETE and skipped.value == 0.0
    assert skipped.user_attrs["outcome"] == outcomes.PREDICTED_OVER_LIMIT
    assert skipped.user_attrs["predicted_peak_memory_bytes"] == pytest.approx(3 * 1024 * MiB, rel=0.05)
    assert skipped.user_attrs["memory_basis_trials"] == [0, 1]
    # As a measured peak's: against the limit less the headroom, (3000 MiB - 0.95 x 2 GiB) / 2 GiB.
    assert skipped.constraints["memory"] == pytest.approx((3000 - 0.95 * 2048) / 2048, abs=0.02)
    assert skipped.user_attrs["reason"].startswith("not run: peak predicted 2.9")
    assert "over the limit 2.00 GiB less 5% headroom (1.90 GiB)" in skipped.user_attrs["reason"]
    summary = summarize(study)
    assert summary.best is not None and summary.best.number != skipped.number
    assert summary.counts[outcomes.PREDICTED_OVER_LIMIT] == 1

    # With the model off, it runs.
    study.enqueue_trial(skipped_params)
    peaks[4096] = 3 * 1024 * MiB
    study.optimize(Objective(ctx, memory_model=False), n_trials=1, catch=(TrialFailed,))
    assert ran == [1024, 2048, 4096]


def test_a_prediction_over_the_limit_less_the_headroom_is_skipped_too(monkeypatch):
    """Feasible means a worst-case peak within the limit less the headroom (5 % here): a
    configuration predicted at 2.15 GiB under a 2 GiB limit is clearly over 1.90 GiB (by more
    than the model's 10 % margin) though not clearly over 2 GiB. Judged against the bare limit,
    it ran, to be found infeasible."""
    peaks = {1024: 400 * MiB, 2048: 1000 * MiB}  # 0.59 MiB per token: 4096 -> about 2200 MiB
    ctx, base, ran = _one_family(monkeypatch, peaks)
    assert ctx.memory_headroom == 0.05
    study = optuna.create_study(direction="maximize")
    for budget in (1024, 2048, 4096):
        study.enqueue_trial({**base, "token_budget": budget})
    study.optimize(Objective(ctx), n_trials=3, catch=(TrialFailed,))
    assert ran == [1024, 2048]
    skipped = study.trials[-1]
    assert skipped.user_attrs["outcome"] == outcomes.PREDICTED_OVER_LIMIT
    assert skipped.user_attrs["predicted_peak_memory_bytes"] == pytest.approx(2200 * MiB, rel=0.02)
    assert skipped.constraints["memory"] > 0


def _with_budgets(space, budgets):
    dims = dict(space.dimensions)
    dims["token_budget"] = dataclasses.replace(dims["token_budget"], choices=tuple(budgets))
    return dataclasses.replace(space, dimensions=dims)


def test_the_summary_counts_the_skipped_and_says_why_the_search_stopped():
    from types import SimpleNamespace

    from autotune.present.summaries import search_summary, summary_json
    from autotune.search.convergence import ConvergenceRule, converged_stop

    study = optuna.create_study(direction="maximize")
    for outcome in (outcomes.OK, outcomes.PREDICTED_OVER_LIMIT, outcomes.PREDICTED_OVER_LIMIT):
        study.add_trial(create_trial(value=1.0, user_attrs={"outcome": outcome}, constraints={"memory": 0.5}))
    result = SimpleNamespace(
        summary=summarize(study),
        context=SimpleNamespace(memory_limit_bytes=LIMIT, device=SimpleNamespace(to_dict=dict)),
        storage_url="sqlite:///studies/s.db",
        recipe_path=None,
        stopped=converged_stop(ConvergenceRule(22, 0.05)),
    )
    text = search_summary(result)
    assert "skipped 2 configurations predicted over the memory limit" in text
    assert "stopped: converged: no trial in the last 22 improved the best feasible tokens/s by more than 5.0 %" in text
    out = summary_json(result)
    assert out["skipped_predicted_over_limit"] == 2
    assert out["stopped"] == {"reason": "converged", "text": result.stopped.text, "patience": 22, "noise": 0.05}


def test_the_skip_reason_names_the_headroom_only_when_there_is_one():
    _, without = outcomes.skipped_over_limit(3 * 1024 * MiB, 2 * 1024 * MiB, 0.0, "a fit")
    assert without == "not run: peak predicted 3.00 GiB, over the limit 2.00 GiB (a fit)"
    _, with_ = outcomes.skipped_over_limit(3 * 1024 * MiB, 2 * 1024 * MiB, 0.05, "a fit")
    assert with_ == "not run: peak predicted 3.00 GiB, over the limit 2.00 GiB less 5% headroom (1.90 GiB) (a fit)"
