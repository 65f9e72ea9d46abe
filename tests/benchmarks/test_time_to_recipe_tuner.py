"""The shipped tuner in the sweep replay (benchmarks/time_to_recipe.py, issue 15 item 4): its
memory model, expert start and convergence rule act on the replayed study through the
package's own functions, as they act on a real one."""

from __future__ import annotations

import sys

import optuna

from tests.helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

from _replay import Strategy, replay  # noqa: E402
from time_to_recipe import TunerHooks, markdown, run, sweep_device, tuner  # noqa: E402

from autotune.search.expert_start import expert_configs  # noqa: E402
from tests.benchmarks.test_time_to_recipe import LIMIT, MiB, in_order, random_sampler, sweep  # noqa: E402

TARGET = 0.97 * 120.0
BEST = {"token_budget": 2048, "amp_dtype": "bfloat16"}


def test_the_memory_model_skips_a_larger_budget_of_a_family_that_went_over():
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


def test_the_tuner_starts_from_the_expert_configuration_and_stops_when_converged():
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    s = sweep()
    expert = expert_configs(sweep_device(s), s.space)
    assert expert == [
        {"token_budget": 4096, "amp_dtype": "float32"}
    ]  # the CPU expert: fp32, the largest budget <= 4096
    # (a random sampler for the tuner's GP: the hooks are the subject, and GP's fits take seconds)
    r = replay(s, tuner(s, sampler=random_sampler), 0, limit=LIMIT, target=TARGET, max_trials=60)
    assert r.steps[0].record["params"] == expert[0]
    # K = max(10, 2 x 2 dimensions) = 10 finished trials without a gain past the noise (1 %: no CVs recorded)
    assert r.stopped.startswith("hook: converged: no trial in the last 10 ")
    # ... finished trials after the last to improve the best feasible (each step here is one), not before
    feasible = [st.record["tokens_per_sec"] if st.fate == "run" and st.record["peak_memory_bytes"] and st.record[
        "peak_memory_bytes"] <= LIMIT else None for st in r.steps]  # fmt: skip
    best = max(v for v in feasible if v is not None)
    assert len(r.steps) - 1 - feasible.index(best) == 10
    assert r.recommended["tokens_per_sec"] == best


def test_the_table_reports_where_a_stopping_strategy_stops():
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    s = sweep()
    fast = [tuner(s, sampler=random_sampler), tuner(s, "tuner -converged", random_sampler, without=["converged"])]
    out = run(s, 2, limit=LIMIT, max_trials=60, only=["tuner", "tuner -converged"], extra=fast)
    stopping, to_target = out["strategies"]["tuner"], out["strategies"]["tuner -converged"]
    assert stopping["stop_rule"] and not to_target["stop_rule"]
    assert stopping["recommends_over_limit"] == 0
    assert all(why.startswith("hook: converged") for why in stopping["stopped"])
    assert to_target["stopped"] == {"target": 2}
    rows = {line.split(" | ")[0]: line for line in markdown(out).splitlines() if line.startswith("| tuner")}
    assert rows["| tuner"].endswith(f" | {stopping['recommends_within_3pct']}/2 |")
    assert rows["| tuner -converged"].endswith(" | - | - | - |")
