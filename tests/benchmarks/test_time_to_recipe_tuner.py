"""The shipped tuner in the sweep replay (benchmarks/time_to_recipe.py): its sampler (the
planner), its memory check and its stop rule act on the replayed study through the package's
own code, as they act on a real one."""

from __future__ import annotations

import sys

import optuna

from tests.helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

from _replay import Strategy, replay  # noqa: E402
from time_to_recipe import TunerHooks, markdown, run, sweep_planner, tuner  # noqa: E402

from autotune.search.planner import EXPERT  # noqa: E402
from tests.benchmarks.test_time_to_recipe import LIMIT, MiB, in_order, random_sampler, sweep  # noqa: E402

TARGET = 0.97 * 120.0
BEST = {"token_budget": 2048, "amp_dtype": "bfloat16"}


def test_the_memory_check_skips_a_larger_budget_of_a_family_that_went_over():
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    s = sweep()
    # 2048/fp32 measures 600 MiB, over the 500 MiB limit: 4096/fp32 (same family, a larger budget) is
    # not run; 1024/fp32 (a smaller budget) is.
    order = in_order((2048, "float32"), (4096, "float32"), (1024, "float32"), (2048, "bfloat16"))
    strategy = Strategy("t", random_sampler, propose=order, skip=TunerHooks(s).skip)
    r = replay(s, strategy, 0, limit=LIMIT, target=TARGET, max_trials=4)
    assert [step.fate for step in r.steps] == ["run", "skipped", "run", "run"]
    assert r.steps[1].predicted_peak == 600 * MiB  # bounded by the over-limit member's measured peak
    assert r.over_limit_run() == 1 and r.seconds_to_target() == 9.5 + 0 + 3.0 + 13.0
    assert r.recommended["params"] == BEST


def test_the_tuner_starts_from_the_planners_expert_proposal_and_stops_on_its_own():
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    s = sweep()
    first = sweep_planner(s, LIMIT).propose([])
    assert first.stage == EXPERT and first.config["amp_dtype"] == "float32"  # a CPU: float32 first
    r = replay(s, tuner(s), 0, limit=LIMIT, target=TARGET, max_trials=60)
    assert r.steps[0].record["config"] == first.config
    assert r.stopped.startswith("hook: ")  # the planner's rule, long before the 60 trials
    assert len(r.steps) <= 6  # the space has 6 configurations, one unsupported
    assert r.recommended["params"] == BEST


def test_the_table_reports_where_a_stopping_strategy_stops():
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    s = sweep()
    out = run(s, 2, limit=LIMIT, max_trials=60, only=["tuner", "tuner -stop"])
    stopping, to_target = out["strategies"]["tuner"], out["strategies"]["tuner -stop"]
    assert stopping["stop_rule"] and not to_target["stop_rule"]
    assert stopping["recommends_over_limit"] == 0 and stopping["recommends_within_3pct"] == 2
    assert all(why.startswith("hook: ") for why in stopping["stopped"])
    assert to_target["stopped"] == {"target": 2}
    rows = {line.split(" | ")[0]: line for line in markdown(out).splitlines() if line.startswith("| tuner")}
    assert rows["| tuner"].endswith(" | 2/2 |")
    assert rows["| tuner -stop"].endswith(" | - | - | - |")
