"""autotune.search.warm_start: a new study runs another study's best configurations first, skips
what cannot run here (another space, another device), and checks the space exactly."""

from __future__ import annotations

import dataclasses
import logging

import optuna
import pytest
from optuna.trial import TrialState

from autotune.config import TrainConfig
from autotune.device import DeviceInfo
from autotune.present.compare import cross_apply, load_comparison
from autotune.search.preflight import preflight
from autotune.search.warm_start import invalid_here, plan_warm_start, warm_start_candidates
from autotune.study.storage import load_ref
from tests.helpers import study_settings, synthetic_study


@pytest.mark.process  # compare_studies runs two searches
def test_warm_start_runs_the_other_studys_best_first(compare_studies):
    studies, expected = compare_studies.dir, compare_studies.warm_expected
    a = load_ref(str(studies / "a.db"))
    # b was warm-started with a's feasible ok searched configurations, best first (more than
    # one: the order shows)
    assert len(expected) >= 2
    rates = [a.trials[number].value for number, _ in expected]
    assert rates == sorted(rates, reverse=True)
    trials = load_ref(str(studies / "b.db")).trials
    # the new study measures its own references first, then the enqueued configurations
    assert [t.user_attrs.get("reference") for t in trials[:2]] == ["baseline", "checklist"]
    warm = [t for t in trials if "warm_start_from" in t.user_attrs]
    assert [t.user_attrs["warm_start_trial"] for t in warm] == [number for number, _ in expected]
    assert all(t.user_attrs["warm_start_from"] == str(studies / "a.db") for t in warm)
    ran = warm[0]
    assert ran.number == 2 and ran.state == TrialState.COMPLETE
    assert ran.user_attrs["config"] == expected[0][1]  # a's best searched configuration, exactly
    assert all(t.state == TrialState.WAITING for t in warm[1:])  # next in line when b is resumed
    # so a's best searched configuration is found in b as the same configuration, trial 2
    comp = load_comparison([str(studies / "a.db"), str(studies / "b.db")])
    a_view, b_view = comp.views
    best_searched = dataclasses.replace(a_view.summary, best=a_view.summary.trial(expected[0][0]))
    cross = cross_apply(dataclasses.replace(a_view, summary=best_searched), b_view)
    assert (cross.source_trial, cross.match, cross.trial) == (expected[0][0], "exact", 2)
    # and the comparison applies a's best, whichever trial it is, to b
    assert next(c for c in comp.cross if c.source == "a").source_trial == a_view.summary.best.number


@pytest.mark.process  # compare_studies runs two searches
def test_warm_start_skips_what_cannot_run_here(studies, tmp_path, caplog):
    ctx = preflight(study_settings(tmp_path, "x")).task
    # a Volta GPU: no bf16, no flash -> every bf16 or flash configuration of a is skipped
    volta = dataclasses.replace(ctx, device=DeviceInfo(kind="cuda", name="Tesla V100", compute_capability="7.0"))
    source = load_ref(str(studies / "a.db"))
    candidates = warm_start_candidates(source, 5)
    runnable = [t for t in candidates if t.config["amp_dtype"] == "float32" and t.config["sdpa_backend"] != "flash"]
    study = optuna.create_study(direction="maximize")
    with caplog.at_level(logging.INFO, logger="autotune.search.warm_start"):
        n = plan_warm_start(str(studies / "a.db"), volta).enqueue(study)
    assert 0 < len(runnable) < len(candidates)  # a searched both kinds: some run on a Volta, some do not
    assert n == len(runnable) == len(study.trials)
    assert "unsupported on this device" in caplog.text and f"skipped {len(candidates) - len(runnable)}" in caplog.text
    # configurations outside this space (the synthetic GPU study's budgets) are skipped, with the knob
    synthetic_study(f"sqlite:///{tmp_path}/h200.db")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="autotune.search.warm_start"):
        assert plan_warm_start(str(tmp_path / "h200.db"), ctx).enqueue(optuna.create_study()) == 0
    assert "outside this search space (token_budget not among 1024, 2048)" in caplog.text
    assert "made for model gpt2" in caplog.text


def test_invalid_here_checks_the_space_exactly(tmp_path):
    ctx = preflight(study_settings(tmp_path, "x")).task
    ok = TrainConfig(
        token_budget=2048, amp_dtype="bfloat16", sdpa_backend="flash", batching="padded", checkpoint_layers=(1,)
    )
    reason, params = invalid_here(ok, ctx)
    assert reason == "" and params["checkpoint_count"] == 1 and params["token_budget"] == 2048
    assert "fixes batching=padded" in invalid_here(ok.replace(batching="packed"), ctx)[0]
    assert "compile_mode not among none" in invalid_here(ok.replace(compile_mode="default"), ctx)[0]
