"""What a newcomer meets after a search: the summary names the study's storage and the recipe,
`unstable` is flagged wherever a figure is shown, `show` without --study lists the studies it
finds, and study names from `pkg.mod:factory` keep the module."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
from click.testing import CliRunner

from autotune.cli import main
from autotune.config import TrainConfig
from autotune.present.summaries import best_table, format_verify, search_summary, show_text, trial_line
from autotune.recipe.from_study import recipe_from_trial
from autotune.search.task import model_slug
from autotune.study.summary import summarize
from autotune.study.urls import default_storage_url

CONFIG = TrainConfig().to_dict()


def add_trial(study: optuna.Study, tps: float, *, unstable: bool = False, reference: str | None = None) -> None:
    measurement = {
        "config": CONFIG,
        "outcome": "ok",
        "tokens_per_sec": tps,
        "unstable": unstable,
        "step_time_cv": 0.318 if unstable else 0.012,
        "peak_memory_bytes": 10**8,
        "model": {"name": "gpt2-tiny", "seq_len": 128},
    }
    attrs = {
        "outcome": "ok",
        "config": CONFIG,
        "measurement": measurement,
        "tokens_per_sec": tps,
        "peak_memory_bytes": 10**8,
    }
    if reference:
        attrs["reference"] = reference
    study.add_trial(optuna.trial.create_trial(value=tps, user_attrs=attrs, constraints={"memory": -1.0}))


def make_study(url: str, name: str, *, unstable_best: bool = True) -> optuna.Study:
    study = optuna.create_study(study_name=name, storage=url, direction="maximize")
    for key, value in {
        "model": "gpt2-tiny",
        "seq_len": 128,
        "memory_limit_bytes": 10**9,
        "hardware": {"kind": "cpu", "name": "a CPU"},
    }.items():
        study.set_user_attr(key, value)
    add_trial(study, 1000.0, reference="baseline")
    add_trial(study, 3180.0, unstable=unstable_best)
    return study


@pytest.fixture
def in_tmp(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def result_of(study: optuna.Study, url: str, recipe_path: str | None = "recipes/s.json"):
    return SimpleNamespace(
        summary=summarize(study),
        task=SimpleNamespace(memory_limit_bytes=10**9),
        storage_url=url,
        recipe_path=Path(recipe_path) if recipe_path else None,
    )


# --- the summary ---------------------------------------------------------------------------------------


def test_the_summary_names_the_storage_and_the_recipe(in_tmp):
    url = default_storage_url("s")
    Path("studies").mkdir()
    study = make_study(url, "s", unstable_best=False)
    text = search_summary(result_of(study, url))
    assert text.splitlines()[-2:] == [
        "storage: sqlite:///studies/s.db  (the same command resumes it; autotune show --study s)",
        "recipe: recipes/s.json",
    ]
    elsewhere = "postgresql://tuner:hunter2@db/autotune"
    text = search_summary(result_of(study, elsewhere))
    assert (
        "storage: postgresql://tuner:***@db/autotune  (the same command resumes it; autotune show --study s "
        "--storage URL)"
        in text
        and "hunter2" not in text
    )


# --- unstable, wherever a figure is shown -------------------------------------------------------------


@pytest.mark.slow
def test_an_unstable_best_is_flagged_in_its_line_the_summary_and_the_recipe(in_tmp):
    url = f"sqlite:///{in_tmp / 's.db'}"
    study = make_study(url, "s")
    summary = summarize(study)
    best = summary.best
    assert best.tokens_per_sec == 3180.0
    assert trial_line(best).endswith("UNSTABLE (step time CV 31.8%)")
    assert "UNSTABLE" not in trial_line(summary.baseline)
    table = best_table(summary)
    assert "3,180 (unstable)" in table and "31.8%  UNSTABLE: verify the recipe" in table
    text = search_summary(result_of(study, url))
    assert "was measured UNSTABLE" in text
    assert "UNSTABLE (step time CV 31.8%)" in show_text(study, summary, 20)
    recipe = recipe_from_trial(summary, "s", url)
    assert recipe.measured["unstable"] is True


def test_verify_flags_an_unstable_figure():
    result = {
        "recorded": {"tokens_per_sec": 3180.0, "unstable": True, "peak_memory_bytes": 10**8},
        "measured": {"tokens_per_sec": 3000.0, "unstable": False, "peak_memory_bytes": 10**8},
        "ratio_tokens_per_sec": 0.94,
        "ratio_peak_memory": 1.0,
        "tolerance": 0.15,
        "passed": True,
        "outcome": "ok",
        "reason": None,
    }
    text = format_verify(result, "r.json")
    assert "3,180 (unstable)" in text and "3,000 (unstable)" not in text


@pytest.mark.slow
def test_compare_and_report_flag_an_unstable_best(in_tmp):
    from autotune.present.compare import comparison_text, load_comparison
    from autotune.present.importance import knob_importance
    from autotune.present.report import report_sections

    make_study(f"sqlite:///{in_tmp / 'a.db'}", "a")
    make_study(f"sqlite:///{in_tmp / 'b.db'}", "b", unstable_best=False)
    text = comparison_text(load_comparison([str(in_tmp / "a.db"), str(in_tmp / "b.db")]))
    (row,) = [line for line in text.splitlines() if line.startswith("effective tokens/s")]
    assert row.count("(unstable)") == 1
    study = optuna.load_study(study_name="a", storage=f"sqlite:///{in_tmp / 'a.db'}")
    summary = summarize(study)
    cells = [c for s in report_sections(study, summary, knob_importance(study)) for r in s.rows for c in r]
    assert "3,180 (unstable)" in cells


# --- show without --study -----------------------------------------------------------------------------


@pytest.mark.slow
def test_show_without_a_study_lists_the_studies_it_finds(in_tmp):
    Path("studies").mkdir()
    make_study(default_storage_url("gpt2-tiny-cpu"), "gpt2-tiny-cpu")
    make_study(default_storage_url("hf-gpt2-cpu"), "hf-gpt2-cpu", unstable_best=False)
    result = CliRunner().invoke(main, ["show"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "2 studies found:"
    assert lines[1].split() == ["study", "model", "device", "trials", "best", "tok/s", "storage"]
    assert lines[3].split()[:4] == ["gpt2-tiny-cpu", "gpt2-tiny", "a", "CPU"]
    assert "3,180" in lines[3] and "sqlite:///studies/gpt2-tiny-cpu.db" in lines[3]
    assert lines[-1] == "show one: autotune show --study gpt2-tiny-cpu"
    listed = json.loads(CliRunner().invoke(main, ["show", "--json"]).stdout)
    assert [s["study"] for s in listed] == ["gpt2-tiny-cpu", "hf-gpt2-cpu"]


@pytest.mark.slow
def test_show_with_a_storage_of_several_studies_lists_them(in_tmp):
    url = f"sqlite:///{in_tmp / 'many.db'}"
    make_study(url, "one")
    make_study(url, "two")
    result = CliRunner().invoke(main, ["show", "--storage", url])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == "2 studies found:"
    assert result.stdout.splitlines()[-1] == f"show one: autotune show --study one --storage {url}"
    single = f"sqlite:///{in_tmp / 'one.db'}"
    make_study(single, "only")
    assert CliRunner().invoke(main, ["show", "--storage", single]).stdout.startswith("study only: model gpt2-tiny")


def test_show_without_any_study(in_tmp):
    result = CliRunner().invoke(main, ["show"])
    assert result.exit_code == 2
    assert result.stderr == (
        "Error: no study found in studies/ (no *.db or *.journal there): run `autotune search` first, "
        "or give --storage\n"
    )


# --- study names ---------------------------------------------------------------------------------------


def test_study_names_keep_the_factorys_module():
    assert model_slug("team_a.models:factory") != model_slug("team_b.models:factory")
    assert model_slug("team_a.models:factory") == "team_a.models-factory"
    assert [model_slug(m) for m in ("gpt2", "hf:gpt2", "hf:llama-tiny", "hf:/data/ckpt/my-llama/")] == [
        "gpt2",
        "hf-gpt2",
        "hf-llama-tiny",
        "hf-my-llama",
    ]
