"""benchmarks/time_to_recipe.py and _replay.py on a constructed sweep: what a replayed search
costs in seconds, the over-limit configurations it runs, and what it recommends."""

from __future__ import annotations

import sys

import optuna

from tests.helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

from _common import enumerate_space  # noqa: E402
from _replay import Strategy, Sweep, replay  # noqa: E402
from time_to_recipe import run  # noqa: E402

from autotune.space.file import parse_space  # noqa: E402

MiB = 2**20
LIMIT = 500 * MiB
SPACE = {
    "version": 1,
    "fixed": {"num_workers": 0},
    "dimensions": {"token_budget": {"choices": [1024, 2048, 4096]}, "amp_dtype": {"choices": ["float32", "bfloat16"]}},
}
# (token_budget, amp_dtype) -> (outcome, tokens/s, peak MiB, process s, compile s, timed s)
FIGURES = {
    (1024, "float32"): ("ok", 100.0, 300, 2.0, 0.0, 1.0),
    (2048, "float32"): ("ok", 150.0, 600, 3.0, 5.0, 1.5),  # faster, but over the limit
    (4096, "float32"): ("oom", None, None, 4.0, 0.0, 0.0),  # out of memory: ran, did not fit
    (1024, "bfloat16"): ("unsupported", None, None, 0.0, 0.0, 0.0),  # pruned before a process
    (2048, "bfloat16"): ("ok", 120.0, 400, 2.5, 10.0, 0.5),  # the best feasible
    (4096, "bfloat16"): ("ok", 90.0, 450, 1.0, 0.0, 1.0),
}


def sweep() -> Sweep:
    space = parse_space(SPACE, source="test", n_layer=2, seq_len=128)
    records = []
    for params, cfg in enumerate_space(space):
        outcome, tps, peak, process, compile_, timed = FIGURES[(cfg.token_budget, cfg.amp_dtype)]
        records.append(
            {
                "params": params,
                "config": cfg.to_dict(),
                "outcome": outcome,
                "tokens_per_sec": tps,
                "peak_memory_bytes": peak and peak * MiB,
                "process_s": process,
                "compile_s": compile_,
                "timed_s": timed,
            }
        )
    return Sweep.from_dict({"space": space.to_dict(), "n_layer": 2, "seq_len": 128, "configurations": records})


def in_order(*configs: tuple[int, str]):
    """A `propose` hook running these configurations in this order."""

    def propose(history):
        n = len(history.steps)
        return dict(zip(("token_budget", "amp_dtype"), configs[n])) if n < len(configs) else None

    return propose


ORDER = (
    (1024, "float32"),  # 3 s
    (2048, "float32"),  # 9.5 s, over the limit
    (2048, "float32"),  # again: reused, 0 s, not run over the limit again
    (1024, "bfloat16"),  # unsupported: 0 s
    (4096, "float32"),  # oom: 4 s, over the limit
    (2048, "bfloat16"),  # 13 s: the target
)


def random_sampler(seed: int) -> optuna.samplers.BaseSampler:
    return optuna.samplers.RandomSampler(seed=seed)


def test_seconds_and_over_limit_count_to_the_target():
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    s = sweep()
    strategy = Strategy("fixed", random_sampler, propose=in_order(*ORDER))
    r = replay(s, strategy, 0, limit=LIMIT, target=0.97 * 120.0, max_trials=10)
    assert [step.fate for step in r.steps] == ["run", "run", "reused", "pruned", "run", "run"]
    assert r.trials_to_target() == 6
    assert r.seconds_to_target() == 3.0 + 9.5 + 0 + 0 + 4.0 + 13.0
    assert r.over_limit_run() == 2  # 2048/fp32 over the limit and 4096/fp32 out of memory, once each
    assert r.stopped == "target"
    assert r.recommended["params"] == {"token_budget": 2048, "amp_dtype": "bfloat16"}


def test_without_constraints_the_over_limit_configuration_is_recommended():
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    s = sweep()
    runs = {}
    for constraints in (True, False):
        strategy = Strategy("fixed", random_sampler, constraints=constraints, propose=in_order(*ORDER))
        runs[constraints] = replay(s, strategy, 0, limit=LIMIT, target=0.97 * 120.0, max_trials=10)
    assert runs[True].recommended["params"] == {"token_budget": 2048, "amp_dtype": "bfloat16"}  # the best that fits
    assert runs[False].recommended["params"] == {"token_budget": 2048, "amp_dtype": "float32"}  # faster, over


def test_a_skipped_configuration_costs_nothing_and_is_never_recommended():
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    s = sweep()

    def skip(history, cfg):  # a memory model that predicts every fp32 budget above 1024 over the limit
        return 700 * MiB if cfg.amp_dtype == "float32" and cfg.token_budget > 1024 else None

    strategy = Strategy("fixed", random_sampler, propose=in_order(*ORDER), skip=skip)
    r = replay(s, strategy, 0, limit=LIMIT, target=0.97 * 120.0, max_trials=10)
    assert [step.fate for step in r.steps] == ["run", "skipped", "skipped", "pruned", "skipped", "run"]
    assert r.seconds_to_target() == 3.0 + 13.0
    assert r.over_limit_run() == 0
    assert r.steps[1].predicted_peak == 700 * MiB


def test_the_summary_counts_over_seeds():
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    out = run(sweep(), 3, limit=LIMIT, only=["grid"])
    assert out["over_limit"] == 2 and out["measured"] == 4
    assert out["seconds_every_configuration"] == 3.0 + 9.5 + 4.0 + 0 + 13.0 + 2.0
    grid = out["strategies"]["grid"]
    assert grid["runs"] == 3 and grid["reached"] == 3 and grid["recommends_over_limit"] == 0
    assert 1 <= grid["trials_to_3pct"]["median"] <= 6


def test_a_stop_rule_ends_the_run_and_the_recommendation_is_what_it_had():
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    s = sweep()

    def stop(history):
        return "three trials" if len(history.steps) == 3 else None

    strategy = Strategy("fixed", random_sampler, propose=in_order(*ORDER), stop=stop)
    r = replay(s, strategy, 0, limit=LIMIT, target=0.97 * 120.0, max_trials=10)
    assert r.stopped == "hook: three trials" and len(r.steps) == 3
    assert r.trials_to_target() is None and r.seconds == 3.0 + 9.5
    assert r.recommended["params"] == {"token_budget": 1024, "amp_dtype": "float32"}  # the faster one does not fit

    # A rule that never fires: the run goes on past the target, to --max-trials.
    strategy = Strategy("fixed", random_sampler, propose=in_order(*ORDER), stop=lambda history: None)
    r = replay(s, strategy, 0, limit=LIMIT, target=0.97 * 120.0, max_trials=8)
    assert r.stopped == "max_trials" and len(r.steps) == 8 and r.trials_to_target() == 6
