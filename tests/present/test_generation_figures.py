"""A generation study says one figure per trial (issue D, #1: the summary said the baseline ran at
39 tok/s and its front 52; the best was 45 in the summary, "41 (mean of 45/38)" in show and 41.3
in the recipe; the front, made of single runs, listed only a trial that by the summary's own
figures beat the recommended one). Each trial's figure is the mean of its runs once re-measured,
in every line, the best's table, the front and the recipe, and the front is made of them."""

from __future__ import annotations

import pytest

import autotune.search.generate as search_generate
from autotune.present.generation import front, front_text, generation_best_table
from autotune.present.text import format_rate
from autotune.recipe.from_study import recipe_from_trial
from autotune.search.run import run_search
from autotune.study.summary import summarize
from tests.search.test_generate_search import modelled_trial, settings


@pytest.mark.slow
def test_every_line_of_a_generation_study_says_the_figure_its_best_was_chosen_by(tmp_path, monkeypatch):
    seen: dict[str, int] = {}

    def remeasured_slower(spec, cfg, **kwargs):
        """The second run of a configuration (its re-measurement) at 60 % of the first."""
        result = modelled_trial(spec, cfg, **kwargs)
        key = str(cfg.to_dict())
        seen[key] = seen.get(key, 0) + 1
        if seen[key] > 1 and result.measurement is not None:
            result.measurement.tokens_per_sec *= 0.6
        return result

    monkeypatch.setattr(search_generate, "run_generation_trial", remeasured_slower)
    study = run_search(settings(tmp_path, n_trials=8, confirm=True)).study
    summary = summarize(study)
    best = summary.best
    assert best.confirmed and best.figure != best.tokens_per_sec  # its two runs differ
    points = front(summary.trials)
    assert all(p.tokens_per_sec == p.trial.figure for p in points)
    assert best.number in [p.trial.number for p in points]  # the choice is on the front it is shown with
    mean = format_rate(best.figure)
    assert f"{mean} (mean of" in generation_best_table(summary)
    assert f"#{best.number:<3} {mean} (mean of" in front_text(summary.trials)
    assert recipe_from_trial(summary, study.study_name, "sqlite://").measured["tokens_per_sec"] == best.figure
