"""The tuner's own time per trial as a study grows: the planner's proposal (both models fitted to
every finished trial, every candidate scored), the memory check and the stop rule, over a
replayed study of up to --trials trials (no stop, no target: the study just grows).

    python benchmarks/tuner_overhead.py [--sweep benchmarks/holdout/large-h200.json.gz] [--trials 200]

Prints the median and the largest seconds per trial in windows of the study's length. A trial's
own time (process, compile, steps) is not in it: this is what the tuner adds to each trial."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import _common  # noqa: F401
import optuna
import time_to_recipe
from _common import md_table
from _replay import TOLERANCE, Sweep, best_feasible, memory_limit, replay

HERE = Path(__file__).resolve().parent


class Timed(optuna.samplers.BaseSampler):
    """The tuner's sampler, its every call timed (a trial's time starts at `before_trial`)."""

    def __init__(self, inner: optuna.samplers.BaseSampler, spent: list[float]) -> None:
        self.inner, self.spent = inner, spent

    @property
    def records(self):  # the objective's memory check reads the study through them, as in a search
        return self.inner.records

    def _timed(self, name: str, *args):
        started = time.perf_counter()
        try:
            return getattr(self.inner, name)(*args)
        finally:
            self.spent[-1] += time.perf_counter() - started

    def infer_relative_search_space(self, study, trial):
        return self._timed("infer_relative_search_space", study, trial)

    def sample_relative(self, study, trial, search_space):
        return self._timed("sample_relative", study, trial, search_space)

    def before_trial(self, study, trial):
        self.spent.append(0.0)
        return self._timed("before_trial", study, trial)

    def sample_independent(self, study, trial, name, distribution):
        return self._timed("sample_independent", study, trial, name, distribution)

    def after_trial(self, study, trial, state, values):
        return self._timed("after_trial", study, trial, state, values)

    def stop_reason(self, study):
        return self._timed("stop_reason", study)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", default=str(HERE / "holdout" / "large-h200.json.gz"))
    parser.add_argument("--quantile", type=float, default=0.5)
    parser.add_argument("--trials", type=int, default=200)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    sweep = Sweep.load(args.sweep)
    limit = memory_limit(sweep.records, args.quantile)
    target = best_feasible(sweep.records, limit)["tokens_per_sec"] * (1 - TOLERANCE)
    spent: list[float] = []
    hooks = time_to_recipe.TunerHooks(sweep)
    strategy = time_to_recipe.tuner(sweep)

    def skip(history, cfg):  # the objective's memory check before each trial: the tuner's time too
        started = time.perf_counter()
        try:
            return hooks.skip(history, cfg)
        finally:
            spent[-1] += time.perf_counter() - started

    strategy = type(strategy)(
        strategy.name,
        strategy.sampler,
        skip=skip,
        stop=lambda history: (history.study.sampler.stop_reason(history.study), None)[1],  # timed, never stops
        build=lambda sw, lim, seed: Timed(hooks.build(sw, lim, seed), spent),
    )
    run = replay(sweep, strategy, 0, limit=limit, target=target, max_trials=args.trials, stop_at_target=False)
    rows = []
    for start in range(0, len(run.steps), 20):
        window = spent[start : start + 20]
        if window:
            rows.append(
                [f"{start + 1}-{start + len(window)}", f"{statistics.median(window):.3f}", f"{max(window):.3f}"]
            )
    print(f"{Path(args.sweep).name}, limit at the {args.quantile:g} quantile: {len(sweep.records):,} configurations")
    print(md_table(["trials", "median s per trial", "max s per trial"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
