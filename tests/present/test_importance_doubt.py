"""Knob importances are not stated as fact from a handful of noisy trials (issue D, #3: after 10
trials the report put `loss_impl (39 %)` first while its box plots showed no effect): below
`MIN_IMPORTANCE_TRIALS` measured trials nothing is ranked, and a ranking carries its spread over
resamples of the trials."""

from __future__ import annotations

import re

import pytest

from autotune.present.compare import compare_views, comparison_rows, view_study
from autotune.present.importance import MIN_IMPORTANCE_TRIALS, importance_trials, knob_importance
from autotune.present.report import report_sections
from autotune.study.summary import summarize
from tests.helpers import synthetic_study


def section(study) -> list:
    return next(s for s in report_sections(study, summarize(study), knob_importance(study)) if "importance" in s.title)


@pytest.mark.slow
def test_ten_trials_rank_no_knob():
    study = synthetic_study("sqlite:///:memory:", n=15)
    assert len(importance_trials(study.get_trials())) == 10 < MIN_IMPORTANCE_TRIALS
    importance = knob_importance(study)
    assert importance.values is None and importance.top() == []
    assert importance.note.startswith("too few trials (10) to rank the knobs")
    s = section(study)
    assert s.rows == [] and s.note.startswith("too few trials (10) to rank the knobs")
    _, rows = comparison_rows(compare_views([view_study(study, "a")]))
    cells = [c for r in rows for c in r if "important" in r[0]]
    assert cells and not any("%" in c for c in cells) and any("too few trials (10)" in c for c in cells)


@pytest.mark.slow
def test_enough_trials_rank_the_knobs_with_their_spread():
    study = synthetic_study("sqlite:///:memory:", n=60)
    n = len(importance_trials(study.get_trials()))
    assert n >= MIN_IMPORTANCE_TRIALS
    importance = knob_importance(study)
    assert importance.values and set(importance.spread) == set(importance.values)
    for low, high in importance.spread.values():
        assert 0.0 <= low <= high <= 1.0
    assert importance.spread == knob_importance(study).spread  # seeded: the same study, the same spread
    for row in section(study).rows:
        assert re.fullmatch(r"\d+% \(90%: \d+-\d+%\)", row[1]), row
    _, rows = comparison_rows(compare_views([view_study(study, "a")]))
    first = next(r for r in rows if r[0] == "important knob 1")
    assert re.fullmatch(r"\w+ \(\d+%, 90%: \d+-\d+%\)", first[1]), first
