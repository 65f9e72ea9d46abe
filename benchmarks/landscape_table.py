"""Every landscape at every memory quantile: the time_to_recipe.py replay of each strategy, in one
table (median [IQR] over the seeds), for benchmarks/README.md.

    python benchmarks/landscape_table.py [--sweeps FILE ...] [--quantiles 0.3 0.5 0.7 0.9] \
        [--strategies tuner tpe random] [--seeds 20] [--max-trials 300] [--json OUT.json]

Sweeps default to benchmarks/landscapes/*.json.gz, benchmarks/holdout/*.json.gz and the recorded
CPU sweep. Columns per strategy: trials to 3 %, wall seconds to 3 % (and against random search's,
computed exactly: `_replay.random_search_exactly`, the row "random (exact)"), seeds that stop on
their own within 3 % (strategies with a stop rule), over-limit configurations run, and the seconds
per trial the replay spent (the strategy's sampler and models, on this machine)."""

from __future__ import annotations

import argparse
import glob
import json
import math
import sys
import time
from pathlib import Path

import _common  # noqa: F401  (puts the checkout on sys.path)
import optuna
import time_to_recipe
from _common import md_table
from _replay import TOLERANCE, Sweep, best_feasible, memory_limit, random_search_exactly

HERE = Path(__file__).resolve().parent
DEFAULT_SWEEPS = [
    *sorted(glob.glob(str(HERE / "landscapes" / "*.json.gz"))),
    *sorted(glob.glob(str(HERE / "holdout" / "*.json.gz"))),
    str(HERE / "data" / "cpu_gpt2_tiny_sweep_large.json"),
]


def cell(s: dict, key: str, digits: int = 0) -> str:
    stats = s[key]

    def one(x: float) -> str:
        return "n.r." if math.isinf(x) else f"{x:.{digits}f}"

    return f"{one(stats['median'])} [{one(stats['q1'])}-{one(stats['q3'])}]"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sweeps", nargs="+", default=DEFAULT_SWEEPS)
    p.add_argument("--quantiles", nargs="+", type=float, default=[0.3, 0.5, 0.7, 0.9])
    p.add_argument("--strategies", nargs="+", default=["tuner", "tpe", "random"])
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--max-trials", type=int, default=300)
    p.add_argument("--json", default=None, help="also write every figure here")
    p.add_argument("--noise", default="auto", help="spread of a repeated measurement; auto: 1.5 %% GPU, 6 %% CPU")
    args = p.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    rows, out = [], []
    for path in args.sweeps:
        sweep = Sweep.load(path)
        name = Path(path).name.removesuffix(".gz").removesuffix(".json")
        for q in args.quantiles:
            started = time.perf_counter()
            result = time_to_recipe.run(
                sweep, args.seeds, quantile_=q, max_trials=args.max_trials, only=args.strategies, noise=args.noise
            )
            result["landscape"], result["quantile"] = name, q
            limit = memory_limit(sweep.records, q)
            exact = random_search_exactly(
                sweep, limit, best_feasible(sweep.records, limit)["tokens_per_sec"] * (1 - TOLERANCE)
            )
            result["random_exact"] = exact
            out.append(result)
            # Against random search's median seconds: exactly (its geometric law, no simulation), so that
            # a landscape where simulated random search rarely reaches the target still has a figure.
            random_s = exact["seconds_to_3pct"]["median"]
            for strategy, s in result["strategies"].items():
                seconds = s["seconds_to_3pct"]["median"]
                # against random search's median seconds; "-" where either did not reach the target
                ratio = "-" if math.isinf(random_s) or math.isinf(seconds) else f"{seconds / random_s:.2f}"
                stops = f"{s['recommends_within_3pct']}/{s['runs']}" if s["stop_rule"] else "-"
                per_trial = s["replay_s"] / max(1.0, s["trials_total"]["median"] * s["runs"])
                rows.append(
                    [
                        name,
                        f"{q:g}",
                        strategy,
                        cell(s, "trials_to_3pct", 1 if s["trials_to_3pct"]["median"] % 1 else 0),
                        cell(s, "seconds_to_3pct"),
                        ratio,
                        stops,
                        cell(s, "trials_total") if s["stop_rule"] else "-",
                        cell(s, "over_limit_run"),
                        f"{s['reached']}/{s['runs']}",
                        f"{per_trial:.2f}",
                    ]
                )
            rows.append(
                [
                    name,
                    f"{q:g}",
                    "random (exact)",
                    cell(exact, "trials_to_3pct"),
                    cell(exact, "seconds_to_3pct"),
                    "1.00",
                ]
                + ["-", "-", cell(exact, "over_limit_run"), "-", "-"]
            )
            print(f"{name} q{q}: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    headers = [
        "landscape",
        "q",
        "strategy",
        "trials to 3 %",
        "wall s to 3 %",
        "s vs random",
        "stops within 3 %",
        "trials to stop",
        "over-limit run",
        "reached",
        "s/trial (replay)",
    ]
    print(md_table(headers, rows))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
