"""Time to a recipe: how many trials, and how many seconds of the user's wall time, each search
strategy needs to measure a configuration within 3 % of the best feasible one of a recorded
sweep, how many configurations over the memory limit it runs on the way, and whether what it
recommends fits.

    python benchmarks/time_to_recipe.py [--json] [--seeds 20] \
        [--sweep benchmarks/data/cpu_gpt2_tiny_sweep_large.json] [--memory-quantile 0.7 | --memory-limit BYTES]

A replay (benchmarks/_replay.py): each trial looks its configuration up in the sweep, costs the
seconds recorded for it (process + compile + timed: its wall time as a trial; a re-proposed
configuration, reused as the tuner reuses it, and an unsupported one, pruned before a process
starts, cost 0) and is recorded on the study as the tuner's Objective records it.

Strategies (`strategies()`; DEFAULT runs unless --strategies names others):
  tuner          the search exactly as `autotune search` runs it by default: the planner's sampler
                 (search.sampler.PlannerSampler over search.planner.Planner), the objective's memory
                 check (search.memory_model.skip_prediction) and the planner's stop rule (`TunerHooks`)
  tuner -stop    the same without its stop rule, run to the target
  tpe            Optuna's TPE (5 start-up trials), the memory constraint recorded
  tpe-unconstr   (on request) the same TPE with no constraint recorded
  gp             (on request) Optuna's GPSampler alone (constrained logEI on the recorded constraint)
  random         Optuna's RandomSampler (`_replay.random_search_exactly` gives its figures exactly)
  smac, botorch  (on request) SMAC3's facade and BoTorch's mixed GP on the experts' mean, as the
                 issue's library candidates (`libraries.py`; `pip install smac botorch`)
  grid           every configuration once, in an order shuffled per seed (a `propose` hook)

Per run: trials and wall seconds until the first feasible configuration within 3 % of the
sweep's best feasible one is measured; the configurations run that did not fit (over the limit
or out of memory) until then; and the study's recommendation when the run ends (Optuna's best
trial: with constraints recorded, the best feasible one, as the tuner's summary picks it). A run
ends at the target, when a strategy's `stop` hook says so, or after --max-trials (default: twice
as many as the sweep has configurations); one that never reached the target counts as infinite in
the medians and shows in `reached`. Medians and interquartile ranges over --seeds seeds.
--noise (default 0; `auto`: 1.5 % on a GPU sweep, 6 % on a CPU one) is the spread of a repeated
measurement: a search sees each configuration's tokens/s moved by it, once per seed, and is judged
on the recorded figures (`_replay.replay`).

Other strategies plug in as `Strategy(name, sampler, skip=..., propose=..., stop=...)` passed as
`run(..., extra=[...])` (see _replay.py for the hooks' contracts)."""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import _common  # noqa: F401
import libraries
import optuna
from _common import md_table, mib
from _replay import (
    TOLERANCE,
    History,
    Run,
    Strategy,
    Sweep,
    best_feasible,
    measured,
    memory_limit,
    over_limit,
    quantile,
    run_seeds,
    trial_cost,
)

from autotune.device.info import DeviceInfo
from autotune.errors import UnsupportedConfig
from autotune.knobs.support import DeviceCapabilities, check_supported
from autotune.search.memory_model import MemoryContext, skip_prediction
from autotune.search.planner import Planner
from autotune.search.sampler import PlannerSampler
from autotune.study.record import read_trials

DEFAULT_SWEEP = Path(__file__).resolve().parent / "data" / "cpu_gpt2_tiny_sweep_large.json"
DEFAULT_QUANTILE = 0.7  # the heaviest ~30 % of measured configurations are over the limit
# Runs stop after this many times the sweep's configurations: random search (with replacement)
# then misses a lone within-3 % configuration in e^-2 ~ 14 % of runs, rather than e^-1 ~ 37 %.
MAX_TRIALS_FACTOR = 2
QUICK_SEEDS = 3


def grid_order(sweep: Sweep) -> Callable[[History], dict[str, Any] | None]:
    """A `propose` hook: every configuration of the sweep once, in an order shuffled per seed."""
    orders: dict[int, list[dict[str, Any]]] = {}

    def propose(history: History) -> dict[str, Any] | None:
        if history.seed not in orders:
            orders[history.seed] = [r["params"] for r in sweep.records]
            random.Random(history.seed).shuffle(orders[history.seed])
        order, n = orders[history.seed], len(history.steps)
        return order[n] if n < len(order) else None

    return propose


def one_torch_thread() -> None:
    """GPSampler fits its model with torch. Its matrices are tiny (one row per trial): more
    threads add only synchronization, and on a shared machine each waits for a descheduled
    sibling (3x slower on 2 busy cores). Imported here, when a GP strategy runs, not before."""
    import torch

    torch.set_num_threads(1)


def gp_sampler(seed: int) -> optuna.samplers.BaseSampler:
    """Optuna's GPSampler as the replay runs it: constrained logEI on the recorded constraint."""
    one_torch_thread()
    # Conditional params (compile_mode in a slice, a checkpoint placement for partial counts)
    # fall to GP's independent sampler, as the tuner's space would; said once here, not per trial.
    return optuna.samplers.GPSampler(seed=seed, warn_independent_sampling=False)


def tpe_with(**settings: Any) -> Callable[[int], optuna.samplers.BaseSampler]:
    """The tuner's TPE with other settings (a sampler to compare, not the one shipped)."""

    def sampler(seed: int) -> optuna.samplers.BaseSampler:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # group=True
            return optuna.samplers.TPESampler(seed=seed, constant_liar=False, **settings)

    return sampler


def sweep_device(sweep: Sweep) -> DeviceInfo:
    """The device the sweep was recorded on (a CPU where the file does not say)."""
    device = sweep.meta.get("device")
    return DeviceInfo.from_dict(device) if device else DeviceInfo(kind="cpu", name="cpu")


_PLANNERS: dict[tuple[str, int, str], Planner] = {}


def sweep_planner(sweep: Sweep, limit: int, variant: str = "") -> Planner:
    """The tuner's planner for a sweep and a limit, as `autotune search` makes one for a study
    (search.run.make_planner): the sweep's space, device and model, every configuration of the
    space a candidate unless a rule or the device refuses it. Built once per sweep and limit (it
    keeps no state of a run: each proposal reads the study)."""
    key = (sweep.path, limit, variant)
    if key not in _PLANNERS:
        device = sweep_device(sweep)
        # A sweep that does not say its GPU's compute capability: one of today's (Ampere), whose
        # rules let bf16 and flash attention run; its own records say what did not.
        capability = device.capability_tuple or ((8, 0) if device.kind == "cuda" else None)
        caps = DeviceCapabilities(device.kind, capability, has_triton=True, cpu_bf16=True)

        def valid(cfg: Any) -> bool:
            try:
                check_supported(cfg, caps)
            except UnsupportedConfig:
                return False
            return True

        memory = MemoryContext.of(
            device.kind,
            model=sweep.meta.get("model"),
            n_layer=sweep.meta.get("n_layer"),
            seq_len=sweep.meta.get("seq_len"),
            dims=None,
        )
        _PLANNERS[key] = Planner(
            sweep.space,
            device_kind=device.kind,
            compute_capability=capability,
            memory=memory,
            feasible_limit=limit,
            valid=valid,
        )
    return _PLANNERS[key]


@dataclass(frozen=True)
class TunerHooks:
    """The search as `autotune search` runs it by default, through the package's own code: its
    sampler (search.sampler.PlannerSampler over search.planner.Planner), the objective's memory
    check (search.memory_model.skip_prediction: a configuration sure not to fit is not run) and
    the planner's stop rule, asked after every trial."""

    sweep: Sweep

    def build(self, sweep: Sweep, limit: int, seed: int) -> optuna.samplers.BaseSampler:
        return PlannerSampler(sweep_planner(sweep, limit), seed=seed)

    def skip(self, history: History, cfg: Any) -> Any:
        planner = sweep_planner(self.sweep, history.limit)
        # as the objective reads the study: through the sampler's records (each finished trial made once)
        records = getattr(history.study.sampler, "records", None)
        reader = records.read if records is not None else read_trials
        prediction = skip_prediction(reader(history.study), cfg.to_dict(), history.limit, planner.memory_context)
        return prediction

    def stop(self, history: History) -> str | None:
        return history.study.sampler.stop_reason(history.study)


def tuner(sweep: Sweep, name: str = "tuner", *, without: Sequence[str] = (), about: str = "") -> Strategy:
    """The tuner as shipped, less the items named in `without` ("stop": run to the target)."""
    hooks = TunerHooks(sweep)
    return Strategy(
        name,
        lambda seed: optuna.samplers.RandomSampler(seed=seed),  # unused: `build` makes the sampler
        skip=hooks.skip,
        stop=None if "stop" in without else hooks.stop,
        build=hooks.build,
        confirm=True,  # the leaders re-measured before the recipe, as autotune search does by default
        about=about
        or f"{name}: the planner's sampler, its memory check, its stop rule and the leaders' re-measurement",
    )


def tpe_sampler(seed: int) -> optuna.samplers.BaseSampler:
    """TPE as Optuna 5 ships it, with the memory constraint (the tuner's sampler before this round)."""
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=5, constant_liar=False)


def strategies(sweep: Sweep) -> dict[str, Strategy]:
    """Every strategy, in the table's order. `DEFAULT` runs by default; the others on request."""
    random_ = lambda seed: optuna.samplers.RandomSampler(seed=seed)  # noqa: E731
    pool = [
        tuner(sweep),
        tuner(sweep, "tuner -stop", without=["stop"], about="the tuner without its stop rule, run to the target"),
        Strategy("tpe", tpe_sampler, about="Optuna's TPE, memory constraint recorded"),
        Strategy("tpe-unconstr", tpe_sampler, constraints=False, about="TPE, no constraint"),
        Strategy("gp", gp_sampler, about="Optuna's GPSampler alone, constraint recorded"),
        Strategy("random", random_, about="random"),
        Strategy("grid", random_, propose=grid_order(sweep), about="every configuration once, shuffled per seed"),
        *libraries.strategies(sweep),  # on request: smac, botorch (pip install smac botorch)
    ]
    return {s.name: s for s in pool}


# The table's strategies by default: the tuner, it run to the target, TPE, and the baselines. GP
# (its fits take minutes) runs with --strategies; benchmarks/README.md has its figures.
DEFAULT = ("tuner", "tuner -stop", "tpe", "random", "grid")


def summarize(runs: Sequence[Run], limit: int, best: float) -> dict[str, Any]:
    """Medians and interquartile ranges over the seeds; an unreached run counts as inf."""

    def stats(values: Sequence[float | None]) -> dict[str, float]:
        xs = [math.inf if v is None else float(v) for v in values]
        return {"median": quantile(xs, 0.5), "q1": quantile(xs, 0.25), "q3": quantile(xs, 0.75)}

    recommended = [r.recommended for r in runs]
    return {
        "runs": len(runs),
        "reached": sum(r.first_good() is not None for r in runs),
        "trials_to_3pct": stats([r.trials_to_target() for r in runs]),
        "seconds_to_3pct": stats([r.seconds_to_target() for r in runs]),
        "over_limit_run": stats([r.over_limit_run() for r in runs]),
        "skipped": stats([r.skipped() for r in runs]),
        "seconds_total": stats([r.seconds for r in runs]),
        "trials_total": stats([len(r.steps) for r in runs]),
        "recommends_over_limit": sum(rec is not None and over_limit(rec, limit) for rec in recommended),
        "recommends_within_3pct": sum(
            rec is not None and not over_limit(rec, limit) and rec["tokens_per_sec"] >= (1 - TOLERANCE) * best
            for rec in recommended
        ),
        "recommends_nothing": sum(rec is None for rec in recommended),
        # how far below the best feasible the recommendation is, where it fits
        "recommendation_shortfall": stats(
            [1 - rec["tokens_per_sec"] / best if rec is not None and measured(rec) else None for rec in recommended]
        ),
        "stopped": {why: sum(r.stopped == why for r in runs) for why in sorted({r.stopped for r in runs})},
    }


# The spread of one measurement of tokens/s, repeated in a fresh process (--noise auto): on a GPU
# 1-2 % (the target the measuring loop is held to, docs and benchmarks/fidelity.py); on this
# project's shared CPU 6 % across fresh processes (benchmarks/README.md, Fidelity).
NOISE = {"cuda": 0.015, "cpu": 0.06}


def measurement_noise(sweep: Sweep) -> float:
    return NOISE["cpu" if sweep_device(sweep).kind == "cpu" else "cuda"]


def run(
    sweep: Sweep,
    seeds: int,
    *,
    quantile_: float = DEFAULT_QUANTILE,
    limit: int | None = None,
    max_trials: int | None = None,
    only: Sequence[str] | None = None,
    extra: Sequence[Strategy] = (),
    noise: float | str = 0.0,
) -> dict[str, Any]:
    records = sweep.records
    limit = limit or memory_limit(records, quantile_)
    best = best_feasible(records, limit)
    target = (1 - TOLERANCE) * best["tokens_per_sec"]
    ran = [r for r in records if measured(r)]
    over = [r for r in records if over_limit(r, limit)]
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    pool = {**strategies(sweep), **{s.name: s for s in extra}}
    chosen = {name: pool[name] for name in (only or [*DEFAULT, *(s.name for s in extra)])}
    max_trials = max_trials or MAX_TRIALS_FACTOR * len(records)
    costs = [trial_cost(r) for r in records]
    noise = measurement_noise(sweep) if noise == "auto" else float(noise)
    out: dict[str, Any] = {
        "sweep": sweep.path,
        "created": sweep.meta.get("created"),
        "machine": sweep.meta.get("machine"),
        "load_average_1min": sweep.meta.get("load_average_1min"),
        "configurations": len(records),
        "measured": len(ran),
        "seeds": seeds,
        "max_trials": max_trials,
        "memory_limit_bytes": limit,
        "over_limit": len(over),
        "best_feasible": {"tokens_per_sec": best["tokens_per_sec"], "params": best["params"]},
        "within_3pct": sum(r["peak_memory_bytes"] <= limit and r["tokens_per_sec"] >= target for r in ran),
        "seconds_every_configuration": round(sum(costs), 1),
        "noise": noise,
        "strategies": {},
    }
    for name, strategy in chosen.items():
        started = time.perf_counter()
        runs = run_seeds(sweep, strategy, seeds, limit=limit, target=target, max_trials=max_trials, noise=noise)
        out["strategies"][name] = {
            "about": strategy.about,
            "stop_rule": strategy.stop is not None,
            **summarize(runs, limit, best["tokens_per_sec"]),
            "replay_s": round(time.perf_counter() - started, 1),  # what replaying it took here
        }
    return out


def _fmt(s: dict[str, float], digits: int = 0) -> str:
    def one(x: float) -> str:
        return "n.r." if math.isinf(x) else f"{x:.{digits}f}"

    return f"{one(s['median'])} [{one(s['q1'])}-{one(s['q3'])}]"


def markdown(out: dict[str, Any]) -> str:
    rows = []
    random_s = out["strategies"].get("random", {}).get("seconds_to_3pct", {}).get("median", math.inf)
    for name, s in out["strategies"].items():
        seconds = s["seconds_to_3pct"]["median"]
        ratio = "-" if math.isinf(random_s) or math.isinf(seconds) else f"{seconds / random_s:.2f}"
        ruled = s["stop_rule"]  # ran until its own rule stopped it: what it cost, and what it then recommends
        rows.append(
            [
                name,
                _fmt(s["trials_to_3pct"], 1 if s["trials_to_3pct"]["median"] % 1 else 0),
                _fmt(s["seconds_to_3pct"]),
                ratio,
                _fmt(s["over_limit_run"]),
                _fmt(s["skipped"]),
                f"{s['reached']}/{s['runs']}",
                f"{s['recommends_over_limit']}/{s['runs']}",
                _fmt(s["trials_total"]) if ruled else "-",
                _fmt(s["seconds_total"]) if ruled else "-",
                f"{s['recommends_within_3pct']}/{s['runs']}" if ruled else "-",
            ]
        )
    n, over = out["measured"], out["over_limit"]
    head = (
        f"Time to a recipe: {out['configurations']} configurations ({n} measured), memory limit "
        f"{mib(out['memory_limit_bytes'])} ({over} of {n} over it, {over / n:.0%}), "
        f"{out['within_3pct']} within 3 % of the best feasible ({out['best_feasible']['tokens_per_sec']:.0f} tok/s); "
        f"every configuration once: {out['seconds_every_configuration']:.0f} s; {out['seeds']} seeds, "
        f"median [IQR], n.r. = not reached within {out['max_trials']} trials\n"
    )
    table = md_table(
        [
            "strategy",
            "trials to 3 %",
            "wall s to 3 %",
            "s vs random",
            "over-limit configs run",
            "skipped",
            "reached",
            "recommends over limit",
            "trials to stop",
            "wall s to stop",
            "stops within 3 %",
        ],
        rows,
    )
    return head + "\n" + table


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true")
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--sweep", default=str(DEFAULT_SWEEP))
    p.add_argument("--memory-quantile", type=float, default=DEFAULT_QUANTILE, help="limit = this quantile of peaks")
    p.add_argument("--memory-limit", type=int, default=None, help="memory limit in bytes (overrides the quantile)")
    p.add_argument("--max-trials", type=int, default=None, help="default: twice the sweep's configurations")
    names = ", ".join(DEFAULT)
    p.add_argument("--strategies", nargs="+", default=None, help=f"names as in the table (default: {names})")
    p.add_argument("--quick", action="store_true", help=f"{QUICK_SEEDS} seeds (a smoke run; the table uses 20)")
    p.add_argument(
        "--noise", default="0", help="spread of a repeated measurement (0.015), or auto: 1.5 %% GPU, 6 %% CPU"
    )
    args = p.parse_args()
    sweep = Sweep.load(args.sweep)
    unknown = sorted(set(args.strategies or ()) - set(strategies(sweep)))
    if unknown:
        p.error(f"unknown strategies {unknown}; choose from {sorted(strategies(sweep))}")
    out = run(
        sweep,
        QUICK_SEEDS if args.quick else args.seeds,
        quantile_=args.memory_quantile,
        limit=args.memory_limit,
        max_trials=args.max_trials,
        only=args.strategies,
        noise=args.noise,
    )
    print(json.dumps(out, indent=1) if args.json else markdown(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
