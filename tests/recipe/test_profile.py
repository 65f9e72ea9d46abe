"""autotune.recipe.profile and `autotune profile`: the breakdown by category, the top
operators, and a trace file, of a recipe measured here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.measure.profile import CATEGORIES
from autotune.recipe.profile import profile_recipe
from tests.helpers import invoke, save_recipe


@pytest.mark.slow
def test_profile_prints_the_breakdown_and_writes_a_trace(recipe, tmp_path):
    out = tmp_path / "prof"
    result = invoke(
        "profile",
        str(save_recipe(recipe, tmp_path / "r.json")),
        "--device",
        "cpu",
        "--steps",
        "1",  # one profiled step has every category and the trace; more only parse longer
        "--warmup",
        "1",
        "--out",
        str(out),
    )
    assert result.exit_code == 0, result.output
    for label in (
        "data wait",
        "attention (SDPA)",
        "matmuls",
        "elementwise / norm",
        "optimizer",
        "other",
        "top operators by self CPU time",
        "trace.json",
    ):
        assert label in result.stdout
    trace = json.loads((out / "trace.json").read_text())
    names = {str(e.get("name")) for e in trace["traceEvents"]}
    assert any("scaled_dot_product" in n for n in names) and "aten::mm" in names
    assert {"autotune:data_wait", "autotune:optimizer"} <= names


@pytest.mark.slow
def test_profile_report_figures(recipe, tmp_path):
    report = profile_recipe(recipe, device="cpu", steps=1, warmup=1, out_dir=tmp_path)
    assert set(report.shares) == set(CATEGORIES)
    assert sum(report.shares.values()) == pytest.approx(1.0)
    for category in ("attention", "matmul", "elementwise", "optimizer"):
        assert report.shares[category] > 0, category
    assert report.time_basis == "self CPU time"
    assert report.top_ops and report.top_ops[0].self_time_s >= report.top_ops[-1].self_time_s
    assert report.tokens > 0 and Path(report.trace_path).is_file()
    json.dumps(report.to_dict())


@pytest.mark.slow
def test_no_garbage_collection_inside_the_profiled_steps(recipe, tmp_path):
    """A collection of a large heap stalls whichever op is running for as long as it takes
    (seconds in a long-lived process), and over a few profiled steps that stall is most of
    the breakdown. The profile holds collection off inside its window, and only there."""
    import gc

    import torch

    during_profile = []

    def note(phase, info):
        if phase == "start":
            during_profile.append(torch.autograd._profiler_enabled())

    thresholds = gc.get_threshold()
    gc.set_threshold(1)  # collect at every allocation: any window left open is seen
    gc.callbacks.append(note)
    try:
        profile_recipe(recipe, device="cpu", steps=1, warmup=1, out_dir=tmp_path)
    finally:
        gc.callbacks.remove(note)
        gc.set_threshold(*thresholds)
    assert during_profile, "no collection at all: the test proves nothing"
    assert not any(during_profile), f"{sum(during_profile)} collections inside the profiled window"
    assert gc.isenabled()


def test_a_caller_that_turned_collection_off_keeps_it_off():
    import gc

    from autotune.measure.profile import no_garbage_collection

    gc.disable()
    try:
        with no_garbage_collection():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


@pytest.mark.compile
def test_a_compile_inside_the_profiled_steps_is_counted_and_said(tmp_path, monkeypatch, aot_eager, fresh_dynamo):
    """Warm-up compiles every shape first; were a step inside the window to compile anyway
    (here: no warm-up at all), its compile time would read as the step's. The report counts
    such events and the text says so."""
    from autotune.config import TrainConfig
    from autotune.measure import profile as profile_module
    from autotune.measure.warmup import WarmUp
    from autotune.present.summaries import format_profile

    monkeypatch.setattr("autotune.measure.setup.warm_up", lambda *args, **kwargs: WarmUp())
    cfg = TrainConfig(compile_mode="default", token_budget=256, batching="packed")
    report = profile_module.profile_config(cfg, model_name="gpt2-tiny", device="cpu", steps=1, out_dir=tmp_path)
    assert report.compiles_in_window >= 1
    assert f"warning: {report.compiles_in_window} compile event(s) inside the profiled steps" in format_profile(report)


@pytest.mark.slow
def test_profile_keeps_the_recipes_gradient_accumulation(tmp_path):
    """A recipe with a global batch is profiled as it was measured: a step is a micro-step and
    the optimizer steps once per global batch (it stepped on every micro-batch before)."""
    import dataclasses

    from autotune.config import TrainConfig
    from autotune.recipe.profile import profile_recipe
    from tests.helpers import cpu_recipe

    recipe = dataclasses.replace(cpu_recipe(token_budget=256, batching="packed"), global_batch_tokens=1024)
    assert recipe.accumulation_steps == 4 and recipe.config == TrainConfig(token_budget=256, batching="packed")
    report = profile_recipe(recipe, device="cpu", steps=6, warmup=0, out_dir=tmp_path)
    assert report.accumulation_steps == 4
    assert report.steps == 8 and report.optimizer_steps == 2  # whole optimizer steps, one per 4 micro-steps


def test_profile_out_naming_a_file_is_refused_before_anything_runs(recipe, tmp_path, monkeypatch):
    """`profile --out FILE` profiled, then failed with a traceback (or overwrote the file)."""
    import autotune.recipe.profile as recipe_profile

    ran = []
    monkeypatch.setattr(recipe_profile, "profile_config", lambda *a, **k: ran.append(a))
    existing = tmp_path / "notes.txt"
    existing.write_text("mine")
    path = save_recipe(recipe, tmp_path / "r.json")
    result = invoke("profile", str(path), "--device", "cpu", "--out", str(existing))
    assert result.exit_code == 2, result.output
    assert "--out" in result.output and "not a folder" in result.output
    assert len(result.output.strip().splitlines()) == 1 and not ran
    assert existing.read_text() == "mine"
    folder = tmp_path / "prof"
    (folder / "trace.json").mkdir(parents=True)
    result = invoke("profile", str(path), "--device", "cpu", "--out", str(folder))
    assert result.exit_code == 2 and "trace.json" in result.output and not ran, result.output
