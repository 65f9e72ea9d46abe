"""Sample efficiency: how many trials the tuner's sampler needs to come within 3% of the
best feasible configuration of an exhaustive sweep, against random search and grid order.

    python benchmarks/sample_efficiency.py [--json] [--seeds 20] [--sweep benchmarks/data/cpu_gpt2_tiny_sweep.json]

The objective is a replay: every configuration of the (reduced) space was measured once by
benchmarks/record_sweep.py; a trial looks its configuration up instead of running it. The
replay records outcomes exactly as autotune.search.objective.Objective does: a measured configuration
is COMPLETE with value tokens/s and the memory constraint (peak - limit) / limit set with
`trial.set_constraint`; an unsupported one is PRUNED; a crashed/timed-out one FAILs. The
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

import _common  # noqa: F401
import optuna
from _common import config_key, md_table
from optuna.trial import TrialState

from autotune.search.sampling import suggest
from autotune.search.space import SearchSpace
from autotune.search.space_file import parse_space
from autotune.search.study import make_sampler

DEFAULT_SWEEP = Path(__file__).resolve().parent / "data" / "cpu_gpt2_tiny_sweep.json"
TOLERANCE = 0.03
STRATEGIES = ("tpe", "random", "grid")
MEASURED = ("ok", "over_memory_limit")


def memory_limit(records: list[dict], quantile: float) -> int:
    """A limit that makes the heaviest configurations infeasible: the `quantile` of the
    measured peaks (rounded down to a MiB)."""
    peaks = sorted(r["peak_memory_bytes"] for r in records if r["outcome"] in MEASURED)
    peak = peaks[min(len(peaks) - 1, int(quantile * len(peaks)))]
    return peak // 2**20 * 2**20


def best_feasible(records: list[dict], limit: int) -> dict:
    feasible = [r for r in records if r["outcome"] in MEASURED and r["peak_memory_bytes"] <= limit]
    return max(feasible, key=lambda r: r["tokens_per_sec"])


def make(strategy: str, seed: int, space: SearchSpace, records: list[dict]) -> optuna.samplers.BaseSampler:
    if strategy == "tpe":
        return make_sampler(seed)  # the tuner's own construction (autotune.search.study.open_study)
    if strategy == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    grid: dict[str, list] = {}
    for r in records:
        for k, v in r["params"].items():
            grid.setdefault(k, [])
            if v not in grid[k]:
                grid[k].append(v)
    return optuna.samplers.GridSampler(grid, seed=seed)  # grid points in a per-seed shuffled order


def replay(
    strategy: str, seed: int, space: SearchSpace, table: dict[str, dict], limit: int, target: float, records: list[dict]
) -> dict:
    """One search; returns trials and distinct configurations until the target was reached."""
    study = optuna.create_study(direction="maximize", sampler=make(strategy, seed, space, records))
    cap = len(table)
    seen: set[str] = set()
    trials = distinct = 0
    reached = {"trials": None, "distinct": None}
    for _ in range(20 * cap):  # bounds a sampler that keeps re-proposing seen configurations
        trial = study.ask()
        cfg = suggest(space, trial)
        key = config_key(cfg)
        rec = table[key]
        trials += 1
        if key not in seen:
            seen.add(key)
            distinct += 1
        try:
            if rec["outcome"] == "unsupported" or space.violation(cfg):
                study.tell(trial, state=TrialState.PRUNED)
            elif rec["outcome"] in MEASURED:
                peak = rec["peak_memory_bytes"]
                if peak <= limit and rec["tokens_per_sec"] >= target:
                    reached["trials"] = reached["trials"] or trials
                    reached["distinct"] = reached["distinct"] or distinct
                trial.set_constraint("memory", (peak - limit) / limit)
                study.tell(trial, rec["tokens_per_sec"])
            elif rec["outcome"] == "oom":
                trial.set_constraint("memory", 1.0)
                study.tell(trial, 0.0)
            else:
                study.tell(trial, state=TrialState.FAIL)
        except RuntimeError:  # GridSampler calls study.stop() once the grid is exhausted (ask/tell has no loop to stop)
            break
        if reached["distinct"] is not None or distinct >= cap and trials >= cap:
            break
    return reached


def summarize(counts: list[int | None], cap: int) -> dict:
    capped = [cap if c is None else min(c, cap) for c in counts]
    return {
        "median": statistics.median(capped),
        "mean": round(statistics.fmean(capped), 2),
        "reached": sum(c is not None and c <= cap for c in counts),
        "runs": len(counts),
    }


def run(sweep_path: Path, seeds: int, quantile: float, limit: int | None) -> dict:
    sweep = json.loads(Path(sweep_path).read_text())
    records = sweep["configurations"]
    space = parse_space(sweep["space"], source=str(sweep_path), n_layer=sweep["n_layer"], seq_len=sweep["seq_len"])
    table = {config_key(r["config"]): r for r in records}
    limit = limit or memory_limit(records, quantile)
    best = best_feasible(records, limit)
    target = (1 - TOLERANCE) * best["tokens_per_sec"]
    measured = [r for r in records if r["outcome"] in MEASURED]
    n_good = sum(r["peak_memory_bytes"] <= limit and r["tokens_per_sec"] >= target for r in measured)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    out: dict = {
        "sweep": str(sweep_path),
        "configurations": len(records),
        "seeds": seeds,
        "memory_limit_bytes": limit,
        "infeasible": sum(r["peak_memory_bytes"] > limit for r in measured),
        "best_feasible": {"tokens_per_sec": best["tokens_per_sec"], "params": best["params"]},
        "within_3pct": n_good,
        "headline": "median_trials_to_3pct (duplicates counted)",
    }
    for strategy in STRATEGIES:
        runs = [replay(strategy, seed, space, table, limit, target, records) for seed in range(seeds)]
        t = summarize([r["trials"] for r in runs], len(records))
        d = summarize([r["distinct"] for r in runs], len(records))
        out[strategy] = {
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
