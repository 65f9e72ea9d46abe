"""The typed trial record: one reader, one feasibility rule, and the figure every presenter shows
(the confirmed mean the recipe records, the single run beside it)."""

from __future__ import annotations

import json

import optuna
import pytest
from optuna.trial import TrialState

from autotune.config import TrainConfig
from autotune.measure import outcomes
from autotune.measure.outcomes import Outcome
from autotune.present.compare import Comparison, comparison_text, view_study
from autotune.present.report import report_sections
from autotune.present.summaries import show_json, show_text, trial_line
from autotune.recipe.from_study import recipe_from_trial
from autotune.study.record import Confirmation, TrialRecord, confirmation_key
from autotune.study.summary import summarize
from tests.helpers import invoke

LIMIT = 1000 * 2**20
HEADROOM = 0.05


def add(study, *, tps, peak, outcome="ok", constraint=None, **config):
    cfg = TrainConfig(**config).to_dict()
    measurement = {"config": cfg, "outcome": outcome, "tokens_per_sec": tps, "peak_memory_bytes": peak}
    frozen = optuna.trial.create_trial(
        value=tps,
        user_attrs={
            "outcome": outcome,
            "config": cfg,
            "tokens_per_sec": tps,
            "peak_memory_bytes": peak,
            "measurement": measurement,
        },
        constraints={
            "memory": constraint if constraint is not None else outcomes.memory_constraint(peak, LIMIT, HEADROOM)
        },
    )
    study.add_trial(frozen)
    return study.trials[-1]


def a_study():
    study = optuna.create_study(direction="maximize")
    study.set_user_attr("memory_limit_bytes", LIMIT)
    study.set_user_attr("memory_headroom", HEADROOM)
    study.set_user_attr("hardware", {"kind": "cpu", "name": "a CPU"})
    study.set_user_attr("model", "gpt2-tiny")
    return study


def test_a_peak_within_the_limit_but_not_the_headroom_is_over_the_limit_in_the_run_and_the_study():
    """One rule: the run decides against the limit less the headroom, so ok means feasible."""
    peak = int(0.97 * LIMIT)
    outcome, reason = outcomes.decide_measured(peak, LIMIT, headroom=HEADROOM)
    assert outcome is Outcome.OVER_MEMORY_LIMIT and "less 5% headroom" in reason
    assert outcomes.decide_measured(int(0.94 * LIMIT), LIMIT, headroom=HEADROOM) == (Outcome.OK, None)
    assert outcomes.memory_constraint(peak, LIMIT, HEADROOM) > 0


def test_an_older_ok_trial_over_the_headroom_reads_as_over_the_limit():
    """A study from before the rule recorded `ok` against the raw limit: read back, it is over."""
    study = a_study()
    add(study, tps=2000.0, peak=int(0.97 * LIMIT), batching="packed")
    add(study, tps=1000.0, peak=int(0.5 * LIMIT))
    old, fits = (TrialRecord.read(t) for t in study.trials)
    assert old.outcome is Outcome.OVER_MEMORY_LIMIT and not old.feasible and old.reason
    assert fits.outcome is Outcome.OK and fits.feasible
    summary = summarize(study)
    assert summary.best.number == fits.number
    assert summary.counts == {"over_memory_limit": 1, "ok": 1}
    # the report's history plot and memory plot agree with the summary on which fits
    rows = {r[0]: r for s in report_sections(study, summary, _no_importance()) for r in s.rows}
    assert rows[f"#{fits.number} (best)"][1] == "ok"


def test_every_presenter_shows_the_confirmed_mean_and_points_at_the_recipes_trial():
    study = a_study()
    lucky = add(study, tps=1300.0, peak=int(0.5 * LIMIT), num_workers=0)
    steady = add(study, tps=1200.0, peak=int(0.5 * LIMIT), batching="packed")
    study.set_user_attr(confirmation_key(lucky.number), Confirmation(Outcome.OK, 900.0).to_dict())
    study.set_user_attr(confirmation_key(steady.number), Confirmation(Outcome.OK, 1180.0).to_dict())
    summary = summarize(study)
    best = summary.best
    assert best.number == steady.number  # the best mean, not the best single run
    assert best.runs == (1200.0, 1180.0) and best.figure == pytest.approx(1190.0)
    recipe = recipe_from_trial(summary, "s", "sqlite://")
    assert recipe.study["trial"] == best.number and recipe.measured["tokens_per_sec"] == pytest.approx(1190.0)
    # show: the recipe's figure, with its runs; the best listed first
    text = show_text(study, summary, 10)
    first = text.splitlines()[3]
    assert first.startswith(f"#{steady.number} ") and "1,190 (mean of 1,200/1,180)" in first
    assert show_json(study, summary)["best"]["tokens_per_sec"] == pytest.approx(1190.0)
    assert "1,100 (mean of 1,300/900)" in trial_line(summary.trial(lucky.number))
    # compare: the same figure
    comp = Comparison([view_study(study, "s")], [], [], [])
    assert "1,190" in comparison_text(comp)
    # report: its best section and its top trials point at the recipe's trial
    sections = {s.title: s for s in report_sections(study, summary, _no_importance())}
    assert f"Best configuration (trial #{best.number})" in sections
    top = sections["Top trials"].rows[0]
    assert top[0] == f"#{best.number} (best)" and top[2].startswith("1,190")


@pytest.mark.slow
def test_a_hand_edited_figure_that_is_not_finite_is_no_measurement_and_never_the_best(tmp_path, monkeypatch):
    """Issue D, E03/E05: a study edited by hand (an objective of +inf on the slowest trial, a tokens/s
    of NaN) made the slowest trial the recipe and printed "best nan tok/s". A figure that is not
    finite is refused where a trial is read: that trial is not measured, says why, and the best
    (`show`, the recipe `export --study` writes) is the fastest trial whose figures are numbers."""
    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path / 's.db'}"
    study = optuna.create_study(study_name="s", storage=url, direction="maximize")
    for key, value in a_study().user_attrs.items():
        study.set_user_attr(key, value)

    def hand_made(value: float, tps: float) -> None:
        cfg = TrainConfig().to_dict()
        measurement = {"config": cfg, "outcome": "ok", "tokens_per_sec": tps, "peak_memory_bytes": LIMIT // 4}
        attrs = {"outcome": "ok", "config": cfg, "tokens_per_sec": tps, "peak_memory_bytes": LIMIT // 4}
        study.add_trial(
            optuna.trial.create_trial(
                value=value, user_attrs={**attrs, "measurement": measurement}, constraints={"memory": -0.5}
            )
        )

    hand_made(2000.0, 2000.0)  # #0: the fastest
    hand_made(float("inf"), 100.0)  # #1: the slowest, its objective edited to +inf
    hand_made(3000.0, float("nan"))  # #2: its tokens/s edited to NaN
    summary = summarize(study)
    assert summary.best.number == 0, summary.best
    for number, what in ((1, "objective value inf"), (2, "tokens_per_sec nan")):
        record = summary.trial(number)
        assert not record.measured and not record.feasible and record.value is None and record.figure is None
        assert what in record.reason and "not finite" in record.reason
    shown = invoke("show", "--study", "s", "--storage", url).output
    assert "best: trial #0" in shown and "nan" not in shown.replace("tokens_per_sec nan", ""), shown
    assert "inf tok/s" not in shown and "objective value inf" in shown
    assert invoke("export", "--study", "s", "--storage", url, "-o", "r.json").exit_code == 0
    recipe = json.loads((tmp_path / "r.json").read_text())
    assert recipe["study"]["trial"] == 0 and recipe["measured"]["tokens_per_sec"] == 2000.0


def test_outcomes_are_an_enum_that_reads_and_writes_as_their_names():
    assert Outcome.read("ok") is Outcome.OK and f"{Outcome.OOM}" == "oom"
    assert Outcome.read("no such outcome") is None and Outcome.read(None) is None
    study = optuna.create_study()
    trial = study.ask()
    trial.set_user_attr("outcome", Outcome.DIVERGED)
    study.tell(trial, state=TrialState.PRUNED)
    assert TrialRecord.read(study.trials[0]).outcome is Outcome.DIVERGED


def _no_importance():
    from autotune.present.importance import Importance

    return Importance(None, 0, "none")


def test_a_reader_that_reads_before_every_trial_makes_each_finished_record_once(monkeypatch):
    """The sampler and the objective read the whole study before every trial: a finished trial's
    record (its configuration validated: milliseconds each) is made once, not once per read, or
    the tuner's own time grows with the study (seconds per trial at 200 trials). What changes a
    finished trial's record (a confirmation run, an attribute set afterwards) makes it anew."""
    from autotune.study.record import RecordCache

    study = a_study()
    for tps in (100.0, 120.0, 90.0):
        add(study, tps=tps, peak=10 * 2**20)
    made = []
    real = TrialRecord.read.__func__
    monkeypatch.setattr(
        TrialRecord, "read", classmethod(lambda cls, t, a=None: made.append(t.number) or real(cls, t, a))
    )
    cache = RecordCache()
    first = cache.read(study)
    assert [r.tokens_per_sec for r in first] == [100.0, 120.0, 90.0] and made == [0, 1, 2]
    add(study, tps=130.0, peak=10 * 2**20)
    second = cache.read(study)
    assert made == [0, 1, 2, 3] and second[:3] == first and second[3].tokens_per_sec == 130.0
    study.set_user_attr(confirmation_key(1), {"tokens_per_sec": 118.0, "outcome": "ok", "reproduced": True})
    third = cache.read(study)
    assert made == [0, 1, 2, 3, 1] and third[1].confirmation is not None
