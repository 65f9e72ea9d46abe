"""The 95 % interval printed beside the best's figure is the interval of that figure (issue D,
#4): beside the mean of a trial and its re-measurement, the interval of the mean, or none when
the two runs disagree by more than their intervals allow; never the first run's own interval."""

from __future__ import annotations

import re

import optuna
from optuna.trial import TrialState, create_trial

from autotune.config import TrainConfig
from autotune.measure.measurement import Measurement
from autotune.present.report import _measurement_rows
from autotune.present.summaries import _trial_json, best_table
from autotune.recipe.from_study import recipe_from_trial
from autotune.study.leaders import confirmation_key
from autotune.study.summary import summarize

LIMIT = 2 * 1024**3


def study_of(rate: float, ci: list[float], second: float | None = None, second_ci: list[float] | None = None):
    study = optuna.create_study(direction="maximize")
    study.set_user_attr("memory_limit_bytes", LIMIT)
    study.set_user_attr("model", "gpt2-tiny")
    config = TrainConfig().to_dict()
    m = Measurement(config=config, outcome="ok", tokens_per_sec=rate, tokens_per_sec_ci95=ci, peak_memory_bytes=10**8)
    attrs = {"config": config, "outcome": "ok", "measurement": m.to_dict(), "tokens_per_sec": rate}
    study.add_trial(create_trial(state=TrialState.COMPLETE, value=rate, constraints={"memory": -0.5}, user_attrs=attrs))
    if second is not None:
        study.set_user_attr(
            confirmation_key(0), {"outcome": "ok", "tokens_per_sec": second, "tokens_per_sec_ci95": second_ci}
        )
    return study


def intervals(text: str) -> list[tuple[float, float]]:
    return [
        (float(a.replace(",", "")), float(b.replace(",", ""))) for a, b in re.findall(r"95%: ([\d,]+)-([\d,]+)", text)
    ]


def shown(study) -> list[str]:
    summary = summarize(study)
    report = "\n".join(" ".join(row) for row in _measurement_rows(summary, LIMIT))
    return [best_table(summary), report]


def test_the_interval_beside_a_mean_of_two_runs_contains_both_or_is_absent():
    """The user's case: 4,357 (95%: 3,252-4,868) (mean of 3,634/5,079)."""
    study = study_of(3634.0, [3252.0, 4016.0], 5079.0, [4868.0, 5290.0])
    for text in shown(study):
        assert "4,356" in text and "3,634/5,079" in text.replace(" / ", "/")
        for low, high in intervals(text):
            assert low <= 3634.0 and 5079.0 <= high, text
        assert "3,252-4,016" not in text and "3,252-4,868" not in text
    summary = summarize(study)
    assert _trial_json(summary.best)["tokens_per_sec_ci95"] is None
    recipe = recipe_from_trial(summary, study.study_name, "sqlite:///x.db")
    ci = recipe.measured["tokens_per_sec_ci95"]
    assert ci is None or (ci[0] <= 3634.0 and 5079.0 <= ci[1])


def test_two_runs_that_agree_give_the_interval_of_their_mean():
    study = study_of(1000.0, [950.0, 1050.0], 1020.0, [970.0, 1070.0])
    for text in shown(study):
        [(low, high)] = intervals(text)
        assert low < 1000.0 and 1020.0 < high and high - low < 100.0  # narrower than either run's
        assert 1010.0 - low == high - 1010.0 or abs((1010.0 - low) - (high - 1010.0)) <= 1.0


def test_a_single_run_keeps_its_own_interval():
    study = study_of(3634.0, [3252.0, 4016.0])
    for text in shown(study):
        assert "3,634 (95%: 3,252-4,016)" in text
    assert _trial_json(summarize(study).best)["tokens_per_sec_ci95"] == [3252.0, 4016.0]
