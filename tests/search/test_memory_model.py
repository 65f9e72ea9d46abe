"""autotune.search.memory_model: the peak of any configuration predicted from every measured
trial (an analytic prior, corrected by what the trials measured), with an interval; and in the
objective, a configuration sure not to fit is never run and never the best."""

from __future__ import annotations

import dataclasses
import math

import optuna
import pytest
from optuna.trial import TrialState, create_trial

from autotune.config import TrainConfig
from autotune.measure import outcomes
from autotune.model.sizes import ModelDims
from autotune.search.memory_model import (
    HOST_ONLY_KNOBS,
    MemoryContext,
    MemoryModel,
    MemoryObservation,
    observations_from_records,
)
from autotune.search.objective import Objective, TrialFailed
from autotune.study.record import TrialRecord
from autotune.study.summary import summarize
from autotune.trial.runner import TrialResult
from tests.helpers import ok_measurement, tiny_context

MiB, GiB = 2**20, 2**30
# gpt2 124M on a GPU with a 20 GiB limit
GPU = MemoryContext.of("cuda", model="gpt2", n_layer=12, seq_len=1024, dims=None)
LIMIT = 20 * GiB


def knobs(budget: int, **changes) -> dict:
    base = {"amp_dtype": "bfloat16", "sdpa_backend": "flash", "batching": "packed"}
    return TrainConfig(**{**base, "token_budget": budget, **changes}).to_dict()


def seen(budget: int, peak_gib: float | None, *, over: bool = False, trial: int | None = None, **changes):
    peak = None if peak_gib is None else int(peak_gib * GiB)
    return MemoryObservation(knobs(budget, **changes), peak, over, trial)


def prior_gib(params) -> float:
    p = GPU.prior(params)
    return (p.static + p.per_token * params["token_budget"]) / GiB


def test_before_any_trial_the_analytic_prior_predicts_with_a_wide_interval():
    model = MemoryModel(GPU, LIMIT).fit([])
    small, large = model.predict(knobs(8192)), model.predict(knobs(262144))
    assert small.peak_bytes / GiB == pytest.approx(prior_gib(knobs(8192)), rel=0.01)
    assert small.high_bytes / small.low_bytes > 3  # the prior's sd of the log is 0.35: ~4x wide
    assert small.p_fit > 0.9 and large.p_fit < 0.1
    # what the prior knows of each knob: fp32 keeps twice the activations, math attention the scores,
    # the standard loss the logits, checkpointed blocks their inputs only
    assert prior_gib(knobs(65536, amp_dtype="float32", sdpa_backend="math")) > prior_gib(knobs(65536))
    assert prior_gib(knobs(65536, sdpa_backend="math")) > prior_gib(knobs(65536))
    assert prior_gib(knobs(65536, loss_impl="chunked")) < prior_gib(knobs(65536))
    assert prior_gib(knobs(65536, checkpoint_layers=list(range(12)))) < prior_gib(knobs(65536))


def test_a_peak_of_one_family_moves_the_prediction_of_another():
    """The prior is 40 % low across the board: one measured peak of one configuration corrects
    every other's prediction, and narrows its interval, before any of them runs."""
    truth = lambda params: 1.4 * prior_gib(params)  # noqa: E731
    measured = [seen(16384, truth(knobs(16384)), trial=0), seen(65536, truth(knobs(65536)), trial=1)]
    model = MemoryModel(GPU, LIMIT).fit(measured)
    other = knobs(32768, loss_impl="chunked", compile_mode="default", compile_scope="blocks+head")
    before = MemoryModel(GPU, LIMIT).fit([]).predict(other)
    after = model.predict(other)
    assert after.peak_bytes / GiB == pytest.approx(truth(other), rel=0.08)
    assert abs(math.log(after.peak_bytes / GiB / truth(other))) < abs(math.log(before.peak_bytes / GiB / truth(other)))
    assert after.high_bytes / after.low_bytes < before.high_bytes / before.low_bytes
    assert after.trials == (0, 1) and "model of 2 measured peaks (trials #0, #1)" in after.basis


def test_a_family_measured_at_two_budgets_extrapolates_on_its_own_line():
    # 2 GiB fixed + 0.1 MiB per token: 65536 -> 8.4 GiB, 262144 -> 27.6 GiB
    line = lambda b: 2 + 0.1 * b / 1024  # noqa: E731
    measured = [seen(16384, line(16384), trial=3), seen(32768, line(32768), trial=7)]
    model = MemoryModel(GPU, LIMIT).fit(measured)
    far = model.predict(knobs(262144))
    assert far.peak_bytes / GiB == pytest.approx(line(262144), rel=0.01)
    assert far.p_fit < 0.02 and far.sure_over  # not run: it would not fit
    assert model.predict(knobs(65536)).p_fit > 0.95


def test_an_oom_teaches_at_least_the_limit_and_bounds_its_family_for_certain():
    # The prior thinks 8192 tokens of fp32 math attention fit in 30 GiB (it says 22); it ran out of memory.
    oom = seen(8192, None, over=True, trial=5, amp_dtype="float32", sdpa_backend="math")
    model = MemoryModel(GPU, 30 * GiB).fit([oom])
    bigger = model.predict(knobs(16384, amp_dtype="float32", sdpa_backend="math"))
    assert bigger.certain and bigger.sure_over and bigger.from_oom and "#5" in bigger.basis
    assert bigger.constraint(30 * GiB) == outcomes.UNKNOWN_EXCESS
    # the same configuration's siblings are taught too: predicted above the limit now
    sibling = knobs(8192, amp_dtype="float32", sdpa_backend="math", loss_impl="chunked")
    assert model.log_peak(sibling)[0] > MemoryModel(GPU, 30 * GiB).fit([]).log_peak(sibling)[0]
    assert model.predict(oom.params).peak_bytes > 30 * GiB


def test_host_only_knobs_do_not_move_a_gpus_peak_but_do_a_cpus():
    measured = [seen(16384, 6.0, trial=0), seen(32768, 8.0, trial=1)]
    gpu = MemoryModel(GPU, LIMIT).fit(measured)
    assert "num_workers" in HOST_ONLY_KNOBS
    with_workers = knobs(32768, num_workers=4, pin_memory=True)
    assert gpu.predict(with_workers).peak_bytes == gpu.predict(knobs(32768)).peak_bytes  # one family on a GPU
    cpu = MemoryContext.of("cpu", model="gpt2-tiny", n_layer=2, seq_len=128, dims=None)
    tiny = lambda **k: TrainConfig(token_budget=1024, **k).to_dict()  # noqa: E731
    assert cpu.prior(tiny(num_workers=2)).static > cpu.prior(tiny()).static  # each worker is a process


def test_a_known_shape_is_used_and_an_unknown_one_guessed_wider():
    exact = MemoryContext.of("cuda", model="a.factory:make", n_layer=24, seq_len=1024, dims=ModelDims(24, 1024, 50304))
    guessed = MemoryContext.of("cuda", model="a.factory:make", n_layer=24, seq_len=1024, dims=None)
    assert exact.exact and not guessed.exact and guessed.dims.d_model == 1024  # the GPT-2 family's width for 24
    assert guessed.prior(knobs(8192)).sd > exact.prior(knobs(8192)).sd


def _trial(number: int, outcome: str, config: dict, peak: int | None = None, **attrs) -> optuna.trial.FrozenTrial:
    user = {"outcome": outcome, "config": config, **attrs}
    if peak is not None:
        user["peak_memory_bytes"] = peak
    state = TrialState.PRUNED if outcome in (outcomes.UNSUPPORTED, outcomes.DIVERGED) else TrialState.COMPLETE
    if outcome in (outcomes.KILLED, outcomes.CRASHED, outcomes.TIMEOUT):
        state = TrialState.FAIL
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
        _trial(7, outcomes.KILLED, knobs(16384)),  # killed from outside: it says nothing about memory
        _trial(8, outcomes.CRASHED, knobs(32768)),
        _trial(9, outcomes.TIMEOUT, knobs(65536)),
    ]
    found = {o.trial: o for o in observations_from_records(TrialRecord.read(t) for t in trials)}
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

    monkeypatch.setattr("autotune.search.training.run_trial", fake_run_trial)
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
    configuration predicted at 2.45 GiB under a 2 GiB limit is surely over 1.90 GiB, and skipped."""
    peaks = {1024: 400 * MiB, 2048: 1100 * MiB}  # 0.68 MiB per token: 4096 -> about 2500 MiB
    ctx, base, ran = _one_family(monkeypatch, peaks)
    assert ctx.memory_headroom == 0.05
    study = optuna.create_study(direction="maximize")
    for budget in (1024, 2048, 4096):
        study.enqueue_trial({**base, "token_budget": budget})
    study.optimize(Objective(ctx), n_trials=3, catch=(TrialFailed,))
    assert ran == [1024, 2048]
    skipped = study.trials[-1]
    assert skipped.user_attrs["outcome"] == outcomes.PREDICTED_OVER_LIMIT
    assert skipped.user_attrs["predicted_peak_memory_bytes"] == pytest.approx(2500 * MiB, rel=0.02)
    assert skipped.constraints["memory"] > 0


def _with_budgets(space, budgets):
    dims = dict(space.dimensions)
    dims["token_budget"] = dataclasses.replace(dims["token_budget"], choices=tuple(budgets))
    return dataclasses.replace(space, dimensions=dims)


def test_the_summary_counts_the_skipped_and_says_why_the_search_stopped():
    from types import SimpleNamespace

    from autotune.present.summaries import search_summary, summary_json
    from autotune.search.stopping import settled_stop

    study = optuna.create_study(direction="maximize")
    for outcome in (outcomes.OK, outcomes.PREDICTED_OVER_LIMIT, outcomes.PREDICTED_OVER_LIMIT):
        study.add_trial(create_trial(value=1.0, user_attrs={"outcome": outcome}, constraints={"memory": 0.5}))
    result = SimpleNamespace(
        summary=summarize(study),
        task=SimpleNamespace(memory_limit_bytes=LIMIT, device=SimpleNamespace(to_dict=dict)),
        storage_url="sqlite:///studies/s.db",
        recipe_path=None,
        stopped=settled_stop("no untried configuration is expected to beat #3 by more than 0.3 %"),
        stages={"reference": 2, "expert prior": 1, "kernels": 4},
    )
    text = search_summary(result)
    assert "skipped 2 configurations predicted over the memory limit" in text
    assert "stopped: settled: no untried configuration is expected to beat #3 by more than 0.3 %" in text
    assert "trials by stage: reference 2, expert prior 1, kernels 4" in text
    out = summary_json(result)
    assert out["skipped_predicted_over_limit"] == 2
    assert out["stopped"] == {"reason": "settled", "text": result.stopped.text}
    assert out["stages"] == {"reference": 2, "expert prior": 1, "kernels": 4}


def test_the_skip_reason_names_the_headroom_only_when_there_is_one():
    _, without = outcomes.skipped_over_limit(3 * 1024 * MiB, 2 * 1024 * MiB, 0.0, "a fit")
    assert without == "not run: peak predicted 3.00 GiB, over the limit 2.00 GiB (a fit)"
    _, with_ = outcomes.skipped_over_limit(3 * 1024 * MiB, 2 * 1024 * MiB, 0.05, "a fit")
    assert with_ == "not run: peak predicted 3.00 GiB, over the limit 2.00 GiB less 5% headroom (1.90 GiB) (a fit)"
