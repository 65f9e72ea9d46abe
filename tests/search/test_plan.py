"""autotune.search.plan: `autotune plan`'s figures are the search's own. Its memory figures are the
search's memory model (the analytic prior before any trial, fitted to a study's measured peaks
with --study); its first trials are the proposals the search's sampler makes on that card; its
cards are a table beside the peak FLOPs. Each test fails when the plan stops agreeing with the
part of the search it names."""

from __future__ import annotations

import json

import optuna
import pytest
from optuna.trial import create_trial

from autotune.config import TrainConfig
from autotune.measure import outcomes
from autotune.search import plan
from autotune.search.memory_model import MemoryModel, memory_context, observations_from_records
from autotune.search.settings import SearchSettings
from autotune.study.record import read_trials
from autotune.study.storage import open_storage


def card_task(model: str = "gpt2", card: str = "h100-80gb", **settings):
    return plan.plan_task(SearchSettings(model=model, **settings), card)


def feasible(task) -> int:
    return outcomes.feasible_peak_bytes(task.memory_limit_bytes, task.memory_headroom)


@pytest.mark.parametrize(
    "model, card", [("gpt2-xl", "t4"), pytest.param("gpt2-medium", "a100-40gb", marks=pytest.mark.slow)]
)
def test_its_memory_figures_are_the_search_memory_model_before_any_trial(model, card):
    task = card_task(model, card)
    answer = plan.make_plan(task)
    context, limit = memory_context(task), feasible(task)
    search_model = MemoryModel(context, limit)
    seq = task.space.seq_len
    assert answer["families"]
    for family in answer["families"]:
        config = family["config"]
        prior = context.prior(config)
        assert (family["static_bytes"], family["per_token_bytes"]) == (int(prior.static), int(prior.per_token))
        predicted = search_model.predict(config)
        at = family["at_target"]
        assert (at["peak_bytes"], at["low_bytes"], at["high_bytes"]) == (
            predicted.peak_bytes,
            predicted.low_bytes,
            predicted.high_bytes,
        )
        assert at["p_fit"] == pytest.approx(predicted.p_fit)
        likely = family["largest_budget"]["likely"]
        if likely is not None:  # the largest whole number of sequences the model says fits (50 %)
            assert likely % seq == 0 and search_model.p_fit({**config, "token_budget": likely}) >= 0.5
            assert search_model.p_fit({**config, "token_budget": likely + seq}) < 0.5
        else:
            assert search_model.p_fit({**config, "token_budget": seq}) < 0.5


def test_a_model_too_large_for_the_card_is_said_not_to_train_with_what_would_make_it_fit():
    answer = plan.make_plan(
        card_task("gpt2-xl", "t4"),
    )
    verdict = answer["verdict"]
    assert not verdict["trains"] and verdict["short_by_bytes"] > 0
    assert any("FSDP2" in r for r in verdict["remedies"])
    assert "h100-80gb" in verdict["cards"] and "t4" not in verdict["cards"]
    assert plan.make_plan(
        card_task("gpt2", "h100-80gb"),
    )["verdict"]["trains"]


def test_the_least_checkpointing_makes_the_target_budget_fit_and_one_block_less_does_not():
    task = card_task("gpt2-xl", "a100-80gb", global_batch_tokens=65536)
    answer = plan.make_plan(task)
    search_model = MemoryModel(memory_context(task), feasible(task))
    found = [row for row in answer["least_checkpointing"] if row["blocks"] is not None]
    assert answer["target_budget"] == 65536 and found
    for row in found:
        config = {**row["config"], "token_budget": 65536}
        assert search_model.p_fit({**config, "checkpoint_layers": list(range(row["blocks"]))}) >= 0.5
        if row["blocks"]:
            assert search_model.p_fit({**config, "checkpoint_layers": list(range(row["blocks"] - 1))}) < 0.5


def test_the_ceiling_is_the_card_dense_peak_over_the_model_flops_per_token():
    task = card_task("gpt2", "h200")
    ceiling = plan.make_plan(task)["ceiling"]
    d, layers, seq = 768, 12, 1024
    per_token = 6 * (12 * layers * d * d + 50304 * d) + 12 * layers * d * seq
    assert ceiling["tokens_per_sec"] == pytest.approx(989e12 / per_token)
    assert ceiling["measured_tokens_per_sec"] == pytest.approx(790e12 / per_token)


def test_with_a_study_its_predictions_are_the_memory_model_fitted_to_the_measured_peaks(tmp_path):
    """A study of gpt2 on an L4 whose real peaks are 1.3x the prior: the plan's calibrated figures
    are the model fitted to them, each trial's as predicted without it (left out)."""
    task = card_task("gpt2", "l4")
    url = f"journal:{tmp_path / 's.journal'}"
    study = optuna.create_study(study_name="gpt2-l4", storage=open_storage(url, create=True), direction="maximize")
    for key, value in task.record().attrs().items():
        study.set_user_attr(key, value)
    context = memory_context(task)
    for budget, dtype, loss in [
        (1024, "float32", "standard"),
        (4096, "float32", "standard"),
        (2048, "bfloat16", "chunked"),
    ]:
        config = {**TrainConfig().to_dict(), "token_budget": budget, "amp_dtype": dtype, "loss_impl": loss}
        prior = context.prior(config)
        peak = int(1.3 * (prior.static + prior.per_token * budget))
        attrs = {"outcome": "ok", "config": config, "tokens_per_sec": 1000.0, "peak_memory_bytes": peak}
        study.add_trial(create_trial(value=1000.0, user_attrs=attrs, constraints={"memory": -0.5}))
    task, records = plan.study_task("gpt2-l4", url)
    answer = plan.make_plan(
        task,
        records=records,
    )
    observations = observations_from_records(read_trials(study))
    fitted = MemoryModel(memory_context(task), feasible(task)).fit(observations)
    for family in answer["families"]:
        assert family["at_target"]["peak_bytes"] == fitted.predict(family["config"]).peak_bytes
    rows = answer["calibration"]
    assert [r["measured_bytes"] for r in rows] == [o.peak_bytes for o in observations]
    for row, left_out in zip(rows, observations):
        others = [o for o in observations if o is not left_out]
        refit = MemoryModel(memory_context(task), feasible(task)).fit(others)
        assert row["calibrated_bytes"] == refit.predict(left_out.params).peak_bytes
        assert row["prior_bytes"] < row["measured_bytes"]  # the prior, 1.3x too low here


SPACE = """
version: 1
description: the GPU space's memory and kernel knobs, small enough to list whole
dimensions:
  num_workers: {choices: [0, 4]}
  token_budget: {choices: [8192, 32768, 131072]}
  batching: {choices: [padded, packed]}
  amp_dtype: {choices: [float32, bfloat16]}
  compile_mode: {choices: [none, default]}
  compile_scope: {choices: [blocks, model], when: {compile_mode: default}}
  loss_impl: {choices: [standard, chunked]}
  sdpa_backend: {choices: [math, flash, cudnn]}
  checkpoint:
    count: {choices: [0, n_layer]}
rules:
  - when: {sdpa_backend: [flash, cudnn]}
    require: {amp_dtype: bfloat16}
    reason: "flash and cudnn need bfloat16"
"""


@pytest.mark.slow
def test_its_first_trials_are_the_proposals_of_the_search_sampler_on_that_card(tmp_path):
    """The search's own path: the study's sampler on a virtual H100 (compile runs there, whatever
    this machine has), asked three times before any trial finished (three workers starting
    together), each configuration recorded as the objective records it."""
    (tmp_path / "space.yaml").write_text(SPACE)
    task = card_task("gpt2-medium", "h100-80gb", space=str(tmp_path / "space.yaml"))
    trials = plan.first_trials(task, 3)
    study = optuna.create_study(direction="maximize", sampler=task.sampler(task.spec.seed))
    proposed = []
    for _ in range(3):
        trial = study.ask()
        config = task.configure(trial, None).to_dict()
        trial.set_user_attr("config", config)
        proposal = study.sampler.proposal_for(trial.number)
        proposed.append((config, proposal.predicted_peak_bytes, proposal.reason))
    assert [(t["config"], t["peak_bytes"], t["reason"]) for t in trials] == proposed
    assert len({json.dumps(c, sort_keys=True) for c, _, _ in proposed}) == 3
    assert trials[0]["config"]["compile_mode"] == "default"  # the card's machine compiles


def test_the_error_it_prints_is_the_range_of_the_committed_measurement():
    """The band `autotune plan` says it was validated to is the measured file's, not a figure typed
    once and left behind when the prior or the measurement changes."""
    from tests.helpers import ROOT

    measured = json.loads((ROOT / "benchmarks/results/2026-12-05/plan_accuracy.json").read_text())
    errors = [row["error"] for row in measured["rows"] if row["error"] is not None]
    assert plan.MEASURED_ERROR == (round(min(errors), 2), round(max(errors), 2))
    assert plan.MEASURED_ON.startswith(f"{len(errors)} runs") and measured["date"] in plan.MEASURED_ON
