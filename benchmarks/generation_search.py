"""The generation search (`autotune search --task generate`) against Optuna's TPE, on the modelled
landscape of tests/search/test_generation_planner.py: its trial processes replaced by a function
of the knobs (a batch that pays up to a p99 latency bound, a static cache, a compiled decode, a
flash decode kernel that pays only over a static cache, prompt buckets; float16 diverges, an
autotuned decode recompiles) with a 2 % spread of readings. The same `run_search` path, storage
and stop rule; only the sampler differs.

    python benchmarks/generation_search.py [--seeds 8] [--n-trials 60] [--strategies planner,tpe] [--json]

Per seed: trials until one within 3 % of the best feasible configuration was measured, trials
run, why the search stopped, and the recommended configuration's true rate over the best's."""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
from pathlib import Path

import _common  # noqa: F401  (the checkout on sys.path)
import optuna

from autotune.config import GenerateConfig
from autotune.search import generate as search_generate
from autotune.search.run import run_search
from autotune.study.record import read_trials
from tests.search import test_generation_planner as modelled
from tests.search.test_generate_search import settings

WITHIN = 0.03


def best_rate(task) -> float:
    """The best feasible configuration's rate, over the whole space (no noise)."""
    caps = task.capabilities
    return max(
        modelled.rate(cfg)
        for _, cfg in task.space.configurations(caps)
        if cfg.dtype != "float16" and cfg.decode_compile != "max-autotune-no-cudagraphs" and cfg.batch_size <= 2
    )


def one_run(strategy: str, seed: int, n_trials: int) -> dict:
    search_generate.run_generation_trial = modelled.landscape(seed)
    if strategy == "tpe":  # what `search --task generate` ran before the planner: TPE, 8 random trials first
        search_generate.GenerateTask.sampler = lambda self, s: optuna.samplers.TPESampler(seed=s, n_startup_trials=8)
    with tempfile.TemporaryDirectory() as tmp:
        result = run_search(
            settings(Path(tmp), max_p99_token_latency_s=modelled.BOUND_S, n_trials=n_trials, seed=seed, confirm=False)
        )
        records = read_trials(result.study)
        top = best_rate(result.task)
        true = [modelled.rate(GenerateConfig.from_dict(r.config)) if r.feasible else 0.0 for r in records]
        reached = next((i + 1 for i, rate in enumerate(true) if rate >= (1 - WITHIN) * top), None)
        chosen = result.summary.best
        return {
            "strategy": strategy,
            "seed": seed,
            "trials_to_3pct": reached,
            "trials_run": len(records),
            "stopped": result.stopped.reason,
            "recommended_over_best": round(modelled.rate(GenerateConfig.from_dict(chosen.config)) / top, 3)
            if chosen
            else None,
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--n-trials", type=int, default=60)
    parser.add_argument("--strategies", default="planner,tpe")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # the tuner's busy-host and progress lines
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    original = search_generate.GenerateTask.sampler
    rows = []
    for strategy in args.strategies.split(","):
        search_generate.GenerateTask.sampler = original
        rows += [one_run(strategy, seed, args.n_trials) for seed in range(args.seeds)]
    if args.json:
        json.dump(rows, sys.stdout, indent=1)
        print()
        return 0
    for strategy in args.strategies.split(","):
        mine = [r for r in rows if r["strategy"] == strategy]
        reached = [r["trials_to_3pct"] for r in mine if r["trials_to_3pct"] is not None]
        settled = sum(r["stopped"] == "settled" for r in mine)
        ratios = [r["recommended_over_best"] or 0.0 for r in mine]
        print(
            f"{strategy}: within 3 % in {len(reached)}/{len(mine)} seeds"
            + (f" (median {statistics.median(reached):g} trials, {min(reached)}-{max(reached)})" if reached else "")
            + f"; settled on its own in {settled}/{len(mine)}, trials run median "
            f"{statistics.median(r['trials_run'] for r in mine):g}; "
            f"recommended / best {min(ratios):.2f}-{max(ratios):.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
