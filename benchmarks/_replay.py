"""Replaying a search against a recorded sweep (benchmarks/record_sweep.py), shared by
sample_efficiency.py (trials) and time_to_recipe.py (seconds).

Every configuration of the sweep's space was measured once; a replayed trial looks its
configuration up instead of running it, and is recorded on the study as
autotune.search.objective.Objective records a real one (`tell`): a measured configuration is
COMPLETE with its tokens/s as the value and, with constraints on, (peak - limit) / limit as the
memory constraint (`trial.set_constraint`, read by TPE and GP); an out-of-memory one is COMPLETE
at 0 with the constraint violated; an unsupported or diverged one is PRUNED; a timed-out or
crashed one FAILs. A configuration proposed again after it completed is reused, as the tuner's
Objective reuses it: a trial, but no process and no seconds.

A strategy is a sampler plus three optional hooks, so that the tuner's own additions (a memory
model that skips configurations, an expert start, a convergence rule) plug in without a new
replay loop:

  propose(history) -> params | None   params to run next instead of the sampler's choice
                                      (enqueued, as the tuner enqueues its reference trials)
  skip(history, cfg) -> prediction    a predicted peak (bytes, or a memory_model.MemoryPrediction)
                                      for a configuration not to run, or None to run it: it
                                      costs nothing and is recorded infeasible, with the
                                      predicted constraint, so the sampler learns from it
  stop(history) -> str | None         why to stop now (after each trial), or None to go on

The replay knows the answer, which a search does not: a run without a stop rule ends once it
has measured a feasible configuration within the tolerance of the sweep's best feasible
(`stop_at_target`); one with a rule runs until the rule stops it."""

from __future__ import annotations

import gzip
import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import _common  # noqa: F401  (puts the checkout on sys.path)
import optuna
from _common import config_key, is_configuration
from optuna.trial import TrialState

from autotune.config import TrainConfig
from autotune.errors import UsageError
from autotune.measure import outcomes
from autotune.search.planner import REMEASURE, measurement_noise
from autotune.space.definition import SearchSpace
from autotune.space.file import parse_space
from autotune.space.sampling import suggest
from autotune.study.leaders import Candidate, tied

TOLERANCE = 0.03  # "within 3 % of the sweep's best feasible"


@dataclass(frozen=True)
class Sweep:
    """A recorded sweep: its space and every configuration's record, by configuration key."""

    path: str
    space: SearchSpace
    records: list[dict[str, Any]]
    table: dict[str, dict[str, Any]]
    meta: dict[str, Any]

    @classmethod
    def from_dict(cls, data: dict[str, Any], path: str = "<sweep>") -> "Sweep":
        space = parse_space(data["space"], source=path, n_layer=data["n_layer"], seq_len=data["seq_len"])
        records = [r for r in data["configurations"] if is_configuration(r["config"])]
        meta = {k: v for k, v in data.items() if k != "configurations"}
        return cls(path, space, records, {config_key(r["config"]): r for r in records}, meta)

    @classmethod
    def load(cls, path: str | Path) -> "Sweep":
        """A sweep file: JSON, or gzipped JSON (.json.gz, as benchmarks/landscapes/ keeps them)."""
        raw = Path(path).read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        return cls.from_dict(json.loads(raw.decode("utf-8")), str(path))


def measured(rec: dict[str, Any]) -> bool:
    """Whether the configuration was measured (a throughput and a peak)."""
    return rec["outcome"] in outcomes.MEASURED and rec.get("tokens_per_sec") is not None


def over_limit(rec: dict[str, Any], limit: int) -> bool:
    """Ran and did not fit: measured above the limit, or out of memory."""
    return (measured(rec) and rec["peak_memory_bytes"] > limit) or rec["outcome"] == outcomes.OOM


def memory_limit(records: Sequence[dict[str, Any]], quantile: float) -> int:
    """A limit that makes the heaviest configurations infeasible: the `quantile` of the
    measured peaks (rounded down to a MiB)."""
    peaks = sorted(r["peak_memory_bytes"] for r in records if measured(r))
    peak = peaks[min(len(peaks) - 1, int(quantile * len(peaks)))]
    return peak // 2**20 * 2**20


def best_feasible(records: Sequence[dict[str, Any]], limit: int) -> dict[str, Any]:
    feasible = [r for r in records if measured(r) and r["peak_memory_bytes"] <= limit]
    return max(feasible, key=lambda r: r["tokens_per_sec"])


# A graph compiled before in the same study (the same knobs but the DataLoader's, which change no
# graph) is read from inductor's on-disk caches (FX graph and autotuning results): one CPU
# configuration here compiled in 105 s cold and 14 s with the cache of an earlier trial (0.13).
# The replay charges a quarter, for every strategy alike: it is the system's, not a search's.
WARM_COMPILE = 0.25


def graph_key(config: dict[str, Any]) -> str:
    """What torch.compile traces: every knob but the host-only (DataLoader) ones."""
    from autotune.search.planner import graph_key as key

    return key(config)


def trial_cost(rec: dict[str, Any], *, warm: bool = False) -> float:
    """Seconds the tuner spends to run this configuration once: process + compile + timed as
    recorded (their sum is the trial's wall time), the compile at WARM_COMPILE of its cost when
    its graph was compiled before; the wall time alone for a sweep recorded before the split; 0
    for one pruned before a process starts."""
    if rec["outcome"] == outcomes.UNSUPPORTED:
        return 0.0
    if "process_s" in rec:
        return rec["process_s"] + rec["compile_s"] * (WARM_COMPILE if warm else 1.0) + rec["timed_s"]
    return float(rec.get("wall_s") or 0.0)


@dataclass(frozen=True)
class Step:
    """One replayed trial."""

    number: int
    key: str
    record: dict[str, Any]
    fate: str  # run | reused | pruned | skipped
    cost_s: float
    over_limit: bool  # ran, and did not fit
    good: bool  # ran, fits, and is within the tolerance of the best feasible
    predicted_peak: int | None = None  # for a skipped one


@dataclass
class History:
    """What a replayed search has done so far: what the hooks read."""

    sweep: Sweep
    seed: int
    limit: int
    target: float  # tokens/s within the tolerance of the best feasible
    study: optuna.Study
    steps: list[Step] = field(default_factory=list)
    graphs: set[str] = field(default_factory=set)  # graphs compiled so far: inductor's cache has them
    noise: float = 0.0  # the spread of one measurement of tokens/s (log), drawn per run and configuration

    @property
    def seconds(self) -> float:
        return sum(s.cost_s for s in self.steps)

    def ran(self) -> list[Step]:
        return [s for s in self.steps if s.fate == "run"]


Propose = Callable[[History], "dict[str, Any] | None"]
Skip = Callable[[History, TrainConfig], Any]  # a peak in bytes or a MemoryPrediction; None: run it
Stop = Callable[[History], "str | None"]


@dataclass(frozen=True)
class Strategy:
    """A search to replay: a sampler per seed, whether the memory constraint is recorded, and
    the hooks (see the module's docstring)."""

    name: str
    sampler: Callable[[int], optuna.samplers.BaseSampler]
    constraints: bool = True
    propose: Propose | None = None
    skip: Skip | None = None
    stop: Stop | None = None
    about: str = ""
    # A sampler that needs the replay's limit (the tuner's planner judges what fits): (sweep, limit,
    # seed) -> sampler, used instead of `sampler` when given.
    build: Callable[[Sweep, int, int], optuna.samplers.BaseSampler] | None = None
    # Re-measure the leaders before recommending, as `autotune search` does by default
    # (search.confirm): see `confirm_leaders`.
    confirm: bool = False


@dataclass(frozen=True)
class Run:
    """One replayed search, and where it ended."""

    steps: list[Step]
    stopped: str  # target | hook: <reason> | max_trials | exhausted
    recommended: dict[str, Any] | None  # the record of the study's best trial at the end
    confirm_s: float = 0.0  # seconds spent re-measuring the leaders after the trials

    def first_good(self) -> Step | None:
        return next((s for s in self.steps if s.good), None)

    def trials_to_target(self) -> int | None:
        step = self.first_good()
        return None if step is None else step.number + 1

    def seconds_to_target(self) -> float | None:
        step = self.first_good()
        return None if step is None else sum(s.cost_s for s in self.steps[: step.number + 1])

    def distinct_to_target(self) -> int | None:
        step = self.first_good()
        if step is None:
            return None
        return len({s.key for s in self.steps[: step.number + 1]})

    def over_limit_run(self) -> int:
        """Configurations run that did not fit, until the target was reached (or the end)."""
        step = self.first_good()
        upto = self.steps if step is None else self.steps[: step.number + 1]
        return sum(s.over_limit for s in upto)

    def skipped(self) -> int:
        """Configurations the memory model skipped, until the target was reached (or the end)."""
        step = self.first_good()
        upto = self.steps if step is None else self.steps[: step.number + 1]
        return sum(s.fate == "skipped" for s in upto)

    @property
    def seconds(self) -> float:
        return sum(s.cost_s for s in self.steps) + self.confirm_s


def replay(
    sweep: Sweep,
    strategy: Strategy,
    seed: int,
    *,
    limit: int,
    target: float,
    max_trials: int,
    stop_at_target: bool | None = None,
    noise: float = 0.0,
) -> Run:
    """One search of `sweep` by `strategy` with `seed`. It stops at the target unless told
    otherwise; by default, only a strategy without a stop rule does (one with a rule runs until
    the rule stops it, so that its cost and its final recommendation show).

    `noise`: what a search sees of a configuration is its recorded tokens/s times exp(noise x z),
    z a standard normal drawn once per seed and configuration (a re-proposal is reused with its
    figures, as the tuner reuses it): a measurement repeated on a GPU moves by 1-2 %, and a search
    that is right only on noiseless figures is fragile. What counts (the target, the
    recommendation) is judged on the recorded figures."""
    if stop_at_target is None:
        stop_at_target = strategy.stop is None
    sampler = strategy.build(sweep, limit, seed) if strategy.build is not None else strategy.sampler(seed)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    history = History(sweep, seed, limit, target, study, noise=noise)
    done: dict[str, int] = {}  # configurations completed, and their trial: a re-proposal reuses them
    stopped = "max_trials"
    for number in range(max_trials):
        if strategy.propose is not None and (params := strategy.propose(history)) is not None:
            study.enqueue_trial(params)
        trial = study.ask()
        try:
            cfg = suggest(sweep.space, trial)
        except UsageError as exc:  # knobs the registry refuses together: pruned at no cost, as the tuner does
            trial.set_user_attr("outcome", outcomes.UNSUPPORTED)
            trial.set_user_attr("reason", str(exc))
            study.tell(trial, state=TrialState.PRUNED)
            refused = {"outcome": outcomes.UNSUPPORTED, "reason": str(exc), "config": None}
            history.steps.append(Step(number, "", refused, "pruned", 0.0, False, False))
            continue
        key = config_key(cfg)
        rec = sweep.table[key]
        try:
            step = _tell(study, trial, cfg, key, rec, number, history, strategy, done)
        except RuntimeError:  # GridSampler stops the study once its grid is exhausted
            stopped = "exhausted"
            break
        history.steps.append(step)
        if stop_at_target and step.good:
            stopped = "target"
            break
        if strategy.stop is not None and (why := strategy.stop(history)) is not None:
            stopped = f"hook: {why}"
            break
    if strategy.confirm:
        recommended, confirm_s = confirm_leaders(history)
        return Run(history.steps, stopped, recommended, confirm_s)
    return Run(history.steps, stopped, _recommended(study, sweep))


def _tell(
    study: optuna.Study,
    trial: optuna.Trial,
    cfg: TrainConfig,
    key: str,
    rec: dict[str, Any],
    number: int,
    history: History,
    strategy: Strategy,
    done: dict[str, int],
) -> Step:
    """Record the trial on the study as the tuner's Objective would (its state, value and
    constraint, and the user attrs the tuner's memory model and convergence rule read: config,
    outcome, peak_memory_bytes, measurement.step_time_cv, duplicate_of), and say what it cost.
    The outcome is decided against the replay's limit, as `outcomes.decide_measured` would."""
    limit = history.limit
    trial.set_user_attr("config_key", key)
    trial.set_user_attr("config", cfg.to_dict())
    if rec["outcome"] == outcomes.UNSUPPORTED or history.sweep.space.violation(cfg):
        trial.set_user_attr("outcome", outcomes.UNSUPPORTED)
        reason = history.sweep.space.violation(cfg) or rec.get("reason")
        if reason:  # what the tuner reads: which knob the device refused
            trial.set_user_attr("reason", reason)
        study.tell(trial, state=TrialState.PRUNED)
        return Step(number, key, rec, "pruned", 0.0, False, False)
    again = _measured_again(study, trial)
    reused = key in done and not again
    if reused:  # a re-proposal costs no process: its original's figures are copied, as the tuner does
        trial.set_user_attr("duplicate_of", done[key])
    if not reused and strategy.skip is not None and (predicted := strategy.skip(history, cfg)) is not None:
        peak, constraint = _prediction(predicted, limit)
        trial.set_user_attr("outcome", outcomes.PREDICTED_OVER_LIMIT)
        trial.set_user_attr("predicted_peak_memory_bytes", peak)
        if strategy.constraints:
            trial.set_constraint("memory", constraint)
        study.tell(trial, 0.0)
        return Step(number, key, rec, "skipped", 0.0, False, False, predicted_peak=peak)
    cost = 0.0 if reused else trial_cost(rec, warm=graph_key(rec["config"]) in history.graphs)
    if not reused and rec["outcome"] != outcomes.UNSUPPORTED:
        history.graphs.add(graph_key(rec["config"]))
        trial.set_user_attr("wall_s", cost)  # what the tuner's cost model reads
    fate = "reused" if reused else "run"
    ran_over = not reused and over_limit(rec, limit)
    if rec.get("peak_memory_bytes") is not None:
        trial.set_user_attr("peak_memory_bytes", rec["peak_memory_bytes"])
    figures = {k: rec[k] for k in ("step_time_cv", "data_wait_fraction", "padding_fraction") if rec.get(k) is not None}
    if figures:
        trial.set_user_attr("measurement", figures)
    if measured(rec):
        fits = rec["peak_memory_bytes"] <= limit
        # A fresh measurement of a configuration whose reading was a bad one draws its own error.
        seen = rec["tokens_per_sec"] * _measurement_error(history, key, run=AGAIN_RUN if again else 0)
        trial.set_user_attr("outcome", outcomes.OK if fits else outcomes.OVER_MEMORY_LIMIT)
        trial.set_user_attr("tokens_per_sec", seen)
        if strategy.constraints:
            trial.set_constraint("memory", (rec["peak_memory_bytes"] - limit) / limit)
        study.tell(trial, seen)
        done.setdefault(key, trial.number)
        good = fate == "run" and fits and rec["tokens_per_sec"] >= history.target
        return Step(number, key, rec, fate, cost, ran_over, good)
    trial.set_user_attr("outcome", rec["outcome"])
    if rec["outcome"] == outcomes.OOM:
        if strategy.constraints:
            trial.set_constraint("memory", 1.0)
        study.tell(trial, 0.0)
        done.setdefault(key, trial.number)
        return Step(number, key, rec, fate, cost, ran_over, False)
    state = TrialState.PRUNED if rec["outcome"] == outcomes.DIVERGED else TrialState.FAIL
    study.tell(trial, state=state)  # not reused by the tuner: a re-proposal runs again
    return Step(number, key, rec, "run", trial_cost(rec), False, False)


AGAIN_RUN = 1000  # the run number of a re-measurement the planner asked for (apart from confirm's runs)


def _measured_again(study: optuna.Study, trial: optuna.Trial) -> bool:
    """Whether the tuner's planner proposed this trial to measure a bad reading again
    (`search.planner.REMEASURE`): the tuner's objective runs it, never reuses the reading."""
    proposal_for = getattr(study.sampler, "proposal_for", None)
    proposal = proposal_for(trial.number) if proposal_for is not None else None
    return proposal is not None and proposal.stage == REMEASURE


def _measurement_error(history: History, key: str, run: int = 0) -> float:
    """The factor by which this run sees this configuration's tokens/s (1 without noise); `run`
    numbers a fresh measurement of it (a re-measurement of the leaders)."""
    if not history.noise:
        return 1.0
    draw = random.Random(f"{history.seed}:{key}" + (f":{run}" if run else "")).gauss(0.0, 1.0)
    return math.exp(history.noise * draw)


LEADERS = 3  # search.confirm: the top distinct configurations re-measured


def confirm_leaders(history: History) -> tuple[dict[str, Any] | None, float]:
    """What `autotune search` recommends after its trials (search.confirm): the LEADERS best
    distinct feasible configurations as measured are each measured once more in a fresh process
    (its compile from inductor's cache); the two best means, while near-tied, are measured again
    (`study.leaders.tied`); the best mean of all its runs wins. (The search re-measures only the
    best when its interval stands clear of the others'; the replay always pays for all three.)
    Returns the winner's record and the seconds the re-measurements cost."""
    seen: dict[str, float] = {}
    for step in history.steps:
        rec = step.record
        if step.fate == "run" and measured(rec) and not over_limit(rec, history.limit):
            seen[step.key] = rec["tokens_per_sec"] * _measurement_error(history, step.key)
    leaders = sorted(seen, key=seen.get, reverse=True)[:LEADERS]
    if not leaders:
        return None, 0.0
    table = history.sweep.table
    runs = {k: [seen[k], table[k]["tokens_per_sec"] * _measurement_error(history, k, run=1)] for k in leaders}
    cost = sum(trial_cost(table[k], warm=True) for k in leaders)
    # Near-tied leaders measured again, by the search's own rule (study.leaders.tied), with the
    # spread the search assumes on the sweep's device.
    noise = measurement_noise((history.sweep.meta.get("device") or {}).get("kind"))
    number = {k: i for i, k in enumerate(leaders)}
    while True:
        top = [Candidate(number[k], v[0], remeasured=True, second=v[1], again=tuple(v[2:])) for k, v in runs.items()]
        again = tied(top, noise)
        if not again:
            break
        for candidate in again:
            k = leaders[candidate.number]
            runs[k].append(table[k]["tokens_per_sec"] * _measurement_error(history, k, run=len(runs[k])))
            cost += trial_cost(table[k], warm=True)
    means = {k: sum(v) / len(v) for k, v in runs.items()}
    return table[max(means, key=means.get)], cost


def _prediction(predicted: Any, limit: int) -> tuple[int, float]:
    """(predicted peak, constraint to record) from a `skip` hook's answer: a
    `search.memory_model.MemoryPrediction` (its own constraint, as the objective records it) or
    a peak in bytes."""
    if hasattr(predicted, "constraint"):
        return int(predicted.peak_bytes), predicted.constraint(limit)
    return int(predicted), max((predicted - limit) / limit, 1e-6)


def _recommended(study: optuna.Study, sweep: Sweep) -> dict[str, Any] | None:
    """What the study recommends at the end: Optuna's best trial, which with constraints
    recorded is the best feasible one (the tuner's summary picks the same: its best `ok`)."""
    try:
        best = study.best_trial
    except ValueError:  # nothing completed (or nothing feasible)
        return None
    return sweep.table[best.user_attrs["config_key"]]


def run_seeds(
    sweep: Sweep,
    strategy: Strategy,
    seeds: int,
    *,
    limit: int,
    target: float,
    max_trials: int,
    stop_at_target: bool | None = None,
    noise: float = 0.0,
) -> list[Run]:
    """The strategy's runs for seeds 0 .. seeds-1."""
    kw = {"limit": limit, "target": target, "max_trials": max_trials, "stop_at_target": stop_at_target, "noise": noise}
    return [replay(sweep, strategy, seed, **kw) for seed in range(seeds)]


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile by linear interpolation; an unreached run counts as +inf (so a median of
    mostly unreached runs is inf, not a flattering finite number)."""
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    if lo == hi:
        return xs[lo]
    if math.isinf(xs[hi]):
        return math.inf
    return xs[lo] + (pos - lo) * (xs[hi] - xs[lo])


def random_search_exactly(sweep: Sweep, limit: int, target: float) -> dict[str, dict[str, float]]:
    """Random search's figures without simulating it: Optuna's RandomSampler draws each parameter
    uniformly from its choices (a conditional one only where it applies, the checkpoint
    placement only for a partial count), so each configuration has a known probability p(c),
    every trial is independent, and the trial that first lands within the tolerance follows a
    geometric law with P = sum of p over the good configurations. Quantiles of trials to the
    target: ceil(log(1 - q) / log(1 - P)); of seconds: that many trials less one at the mean cost
    of a trial that is not good, plus a good one's mean cost; over-limit runs likewise. A
    re-proposed configuration is charged as a new one (its reuse is free in the replay): exact
    while the trials are few against the space, a little against random search otherwise.
    Returns {statistic: {median, q1, q3}} as `summarize` does."""
    from _common import config_key, dimension_values, enumerate_space

    space = sweep.space
    choices = {name: len(dimension_values(space, dim)) for name, dim in space.dimensions.items()}
    if space.checkpoint:
        choices["checkpoint_count"] = len(dimension_values(space, space.checkpoint.count))
        choices["checkpoint_placement"] = len(space.checkpoint.placements)
    p_good = p_bad = cost_good = cost_bad = over_bad = 0.0
    for params, cfg in enumerate_space(space):
        p = math.prod(1.0 / choices[name] for name in params)
        rec = sweep.table[config_key(cfg)]
        cost = trial_cost(rec)
        if measured(rec) and not over_limit(rec, limit) and rec["tokens_per_sec"] >= target:
            p_good, cost_good = p_good + p, cost_good + p * cost
        else:
            p_bad, cost_bad, over_bad = p_bad + p, cost_bad + p * cost, over_bad + p * over_limit(rec, limit)
    # The draws that make no configuration (knobs the registry refuses together, not listed here)
    # are bad trials at no cost: the bad mass is all that is not good.
    p_bad = 1.0 - p_good
    mean_good, mean_bad, over_share = cost_good / p_good, cost_bad / p_bad, over_bad / p_bad

    def trials(q: float) -> float:
        return float(math.ceil(math.log(1 - q) / math.log1p(-p_good)))

    quantiles = {"median": 0.5, "q1": 0.25, "q3": 0.75}
    return {
        "trials_to_3pct": {k: trials(q) for k, q in quantiles.items()},
        "seconds_to_3pct": {k: (trials(q) - 1) * mean_bad + mean_good for k, q in quantiles.items()},
        "over_limit_run": {k: (trials(q) - 1) * over_share for k, q in quantiles.items()},
        "p_good": {"median": p_good, "q1": p_good, "q3": p_good},
    }
