"""Sample efficiency: how many trials the tuner's sampler needs to come within 3% of the
best feasible configuration of an exhaustive sweep, against random search and grid order.

    python benchmarks/sample_efficiency.py [--json] [--seeds 20] [--sweep benchmarks/data/cpu_gpt2_tiny_sweep.json]

The objective is a replay (benchmarks/_replay.py): every configuration of the (reduced) space
was measured once by benchmarks/record_sweep.py; a trial looks its configuration up instead of
running it and is recorded as autotune.search.objective.Objective records it. The
reference trials (baseline, checklist) that a real study enqueues first are left out: they
are not in the reduced space and would add the same 2 trials to every strategy.

Two counts per run:
  trials     every proposal counts, duplicates included (the tuner's --n-trials counts them
             too, though a duplicate is reused at no measuring cost). The headline figure.
  distinct   only configurations not proposed before count (what the search costs in
             measuring time, since duplicates are free in our tuner).
A run that has not reached the target after as many trials as the space has configurations
is capped there (counted as that number) and reported as not reached."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Callable

import _common  # noqa: F401
import optuna
from _common import md_table
from _replay import TOLERANCE, History, Strategy, Sweep, best_feasible, measured, memory_limit, run_seeds
from time_to_recipe import TunerHooks, tpe_sampler

DEFAULT_SWEEP = Path(__file__).resolve().parent / "data" / "cpu_gpt2_tiny_sweep.json"
STRATEGIES = ("tpe", "random", "grid")


def grid_sampler(records: list[dict]) -> Callable[[int], optuna.samplers.BaseSampler]:
    """Optuna's GridSampler over every recorded value of every param: grid points in an
    order shuffled per seed."""
    grid: dict[str, list] = {}
    for r in records:
        for k, v in r["params"].items():
            grid.setdefault(k, [])
            if v not in grid[k]:
                grid[k].append(v)
    return lambda seed: optuna.samplers.GridSampler(grid, seed=seed)


def strategies(sweep: Sweep) -> dict[str, Strategy]:
    def everything_seen(history: History) -> str | None:  # bounds a sampler that keeps re-proposing
        n = len(sweep.table)
        return (
            "every configuration seen" if len(history.steps) >= n and len({s.key for s in history.steps}) >= n else None
        )

    return {
        # the tuner's own construction (autotune.study.lifecycle.open_study)
        "tuner": Strategy(
            "tuner",
            tpe_sampler,
            build=TunerHooks(sweep).build,
            skip=TunerHooks(sweep).skip,
            stop=lambda h: TunerHooks(sweep).stop(h) or everything_seen(h),
        ),
        "tpe": Strategy("tpe", tpe_sampler, stop=everything_seen),
        "random": Strategy("random", lambda seed: optuna.samplers.RandomSampler(seed=seed), stop=everything_seen),
        "grid": Strategy("grid", grid_sampler(sweep.records), stop=everything_seen),
    }


def summarize(counts: list[int | None], cap: int) -> dict:
    capped = [cap if c is None else min(c, cap) for c in counts]
    return {
        "median": statistics.median(capped),
        "mean": round(statistics.fmean(capped), 2),
        "reached": sum(c is not None and c <= cap for c in counts),
        "runs": len(counts),
    }


def run(sweep_path: Path, seeds: int, quantile: float, limit: int | None) -> dict:
    sweep = Sweep.load(sweep_path)
    records = sweep.records
    limit = limit or memory_limit(records, quantile)
    best = best_feasible(records, limit)
    target = (1 - TOLERANCE) * best["tokens_per_sec"]
    measured_ = [r for r in records if measured(r)]
    n_good = sum(r["peak_memory_bytes"] <= limit and r["tokens_per_sec"] >= target for r in measured_)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    out: dict = {
        "sweep": str(sweep_path),
        "configurations": len(records),
        "seeds": seeds,
        "memory_limit_bytes": limit,
        "infeasible": sum(r["peak_memory_bytes"] > limit for r in measured_),
        "best_feasible": {"tokens_per_sec": best["tokens_per_sec"], "params": best["params"]},
        "within_3pct": n_good,
        "headline": "median_trials_to_3pct (duplicates counted)",
    }
    cap = len(records)
    for name, strategy in strategies(sweep).items():
        runs = run_seeds(sweep, strategy, seeds, limit=limit, target=target, max_trials=20 * cap, stop_at_target=True)
        t = summarize([r.trials_to_target() for r in runs], cap)
        d = summarize([r.distinct_to_target() for r in runs], cap)
        out[name] = {
            "median_trials_to_3pct": t["median"],
            "mean_trials_to_3pct": t["mean"],
            "median_distinct_to_3pct": d["median"],
            "mean_distinct_to_3pct": d["mean"],
            "reached": t["reached"],
            "runs": t["runs"],
        }
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true")
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--sweep", default=str(DEFAULT_SWEEP))
    p.add_argument(
        "--memory-quantile",
        type=float,
        default=0.75,
        help="memory limit = this quantile of the sweep's measured peaks (default 0.75)",
    )
    p.add_argument("--memory-limit", type=int, default=None, help="memory limit in bytes (overrides the quantile)")
    args = p.parse_args()
    out = run(Path(args.sweep), args.seeds, args.memory_quantile, args.memory_limit)
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    rows = [
        [
            s,
            out[s]["median_trials_to_3pct"],
            out[s]["mean_trials_to_3pct"],
            out[s]["median_distinct_to_3pct"],
            out[s]["mean_distinct_to_3pct"],
            f"{out[s]['reached']}/{out[s]['runs']}",
        ]
        for s in STRATEGIES
    ]
    print(
        f"Sample efficiency: {out['configurations']} configurations, memory limit "
        f"{out['memory_limit_bytes'] / 2**20:.0f} MiB ({out['infeasible']} infeasible), "
        f"{out['within_3pct']} within 3% of the best feasible ({out['best_feasible']['tokens_per_sec']:.0f} tok/s), "
        f"{out['seeds']} seeds\n"
    )
    print(
        md_table(
            [
                "strategy",
                "median trials to 3% (headline)",
                "mean trials",
                "median distinct configs",
                "mean distinct",
                "reached",
            ],
            rows,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
