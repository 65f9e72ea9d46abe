"""A speedup over a reference trial that was unstable (its step times varied by 113 %) or did
not fit the memory limit is flagged wherever a speedup is shown: the summary and `show`, their
JSON, `compare`, the report and the recipe. A sound reference gives a plain figure."""

from __future__ import annotations

import json

import optuna
import pytest
from optuna.trial import TrialState, create_trial

from autotune.config import TrainConfig
from autotune.errors import UsageError
from autotune.present.compare import comparison_text, load_comparison
from autotune.present.report import _measurement_rows
from autotune.present.summaries import best_table, show_json
from autotune.recipe.from_study import recipe_from_trial
from autotune.recipe.recipe import Recipe
from autotune.study.summary import summarize

LIMIT = 2 * 1024**3


def add(study: optuna.Study, rate: float, *, reference: str | None = None, cv: float = 0.01, peak: int = 10**8):
    config = TrainConfig(token_budget=int(rate)).to_dict()
    over = peak > LIMIT
    measurement = {
        "config": config,
        "outcome": "over_memory_limit" if over else "ok",
        "tokens_per_sec": rate,
        "step_time_cv": cv,
        "unstable": cv > 0.05,
        "peak_memory_bytes": peak,
    }
    attrs = {
        "config": config,
        "outcome": measurement["outcome"],
        "tokens_per_sec": rate,
        "peak_memory_bytes": peak,
        "measurement": measurement,
    }
    if reference:
        attrs["reference"] = reference
    constraint = (peak - LIMIT) / LIMIT
    study.add_trial(
        create_trial(state=TrialState.COMPLETE, value=rate, constraints={"memory": constraint}, user_attrs=attrs)
    )


def study_of(storage: str = "sqlite:///:memory:", *, sound: bool = False) -> optuna.Study:
    study = optuna.create_study(study_name="flags", storage=storage, direction="maximize")
    study.set_user_attr("memory_limit_bytes", LIMIT)
    study.set_user_attr("model", "gpt2-tiny")
    add(study, 100.0, reference="baseline", cv=0.01 if sound else 1.13)  # steps varied by 113 %
    add(study, 5000.0, reference="checklist", peak=LIMIT if sound else 2 * LIMIT)  # over the limit
    add(study, 9972.0)
    return study


def test_a_speedup_over_an_unstable_or_infeasible_reference_is_flagged_wherever_shown(tmp_path):
    study = study_of(f"sqlite:///{tmp_path / 'flags.db'}")
    summary = summarize(study)
    table = best_table(summary)  # the search's summary and `show`
    assert "99.72x (the baseline was unstable: step time CV 113.0%)" in table
    assert "1.99x (the checklist broke the memory limit)" in table
    shown = show_json(study, summary)
    assert shown["speedup_vs_baseline_flags"] == ["unstable"]
    assert shown["speedup_vs_checklist_flags"] == ["infeasible"]
    report = dict((row[0], row[1]) for row in _measurement_rows(summary, LIMIT))
    assert report["speedup vs baseline"].startswith("99.72x (the baseline was unstable")
    assert report["speedup vs checklist"] == "1.99x (the checklist broke the memory limit)"
    comparison = load_comparison([str(tmp_path / "flags.db")])
    assert "99.72x (the baseline was unstable: step time CV 113.0%)" in comparison_text(comparison)
    recipe = recipe_from_trial(summary, "flags", "sqlite:///flags.db")
    assert recipe.reference_flags == {"baseline": ["unstable"], "checklist": ["infeasible"]}
    again = Recipe.from_dict(json.loads(json.dumps(recipe.to_dict())))  # the file says it too
    assert again.reference_flags == recipe.reference_flags
    with pytest.raises(UsageError, match="reference_flags.baseline: expected a list of unstable / infeasible"):
        Recipe.from_dict({**recipe.to_dict(), "reference_flags": {"baseline": ["lucky"]}})


def test_a_speedup_over_sound_references_is_a_plain_figure():
    study = study_of(sound=True)
    summary = summarize(study)
    table = best_table(summary)
    assert ["speedup", "vs", "baseline", "99.72x"] in [line.split() for line in table.splitlines()]
    assert ["speedup", "vs", "checklist", "1.99x"] in [line.split() for line in table.splitlines()]
    shown = show_json(study, summary)
    assert shown["speedup_vs_baseline_flags"] == [] and shown["speedup_vs_checklist_flags"] == []
    recipe = recipe_from_trial(summary, "flags", "sqlite:///flags.db")
    assert recipe.reference_flags == {} and "reference_flags" not in recipe.to_dict()
