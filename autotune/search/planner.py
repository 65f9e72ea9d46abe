"""The search's reasoning: what to measure next, and when to stop.

Every configuration of the space (or, for a space too large to list, a sample of it plus the
neighbours of the best so far) is a candidate. Before each trial the planner fits two models to
every trial the study has finished:

- throughput (`search.throughput_model`): log tokens/s, a Bayesian linear model whose prior is
  what experts know per device class (`search.priors`: bf16 over fp32, flash over math, compile
  over eager, packed over padded, a budget that saturates, checkpointing's third more compute);
- memory (`search.memory_model`): the peak of any configuration, with an interval, from an
  analytic prior and every measured peak.

It then proposes the candidate with the largest expected improvement over the best feasible
tokens/s so far, times the chance that it fits the limit less the headroom (likely, or at the
memory edge with a material gain), per expected second
(a compile costs minutes; a graph compiled before comes from inductor's cache; DataLoader knobs
change no graph). So the first trial is what an expert runs first: the precision, kernels and
compile the priors favour, at the largest budget predicted to fit. The next ones test the
choices the priors are least sure of where a gain is still plausible, fit the budget and the
checkpointing to the memory measured, and try DataLoader settings only once a measurement says
the loop waited for data. A configuration sure not to fit is never proposed.

The experts' sum cannot express every landscape: its residuals get a Gaussian process of their
own (`search.residual_model`), which corrects the predictions near what was measured, keeps doubt
about the rest, and discounts a reading far below what every other trial predicts (a bad one).

It stops when no candidate is expected to gain more than `STOP_GAIN` over the best (a fraction of
the measurement noise), and says so, with how well the model predicted its own leading trials;
never right after a trial that improved the best by more than the noise, and never while the
model mispredicts its own leading trials. Torch-free; numpy."""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from autotune import registry
from autotune.config import TrainConfig
from autotune.measure import outcomes
from autotune.search import priors
from autotune.search.features import Columns
from autotune.search.memory_model import Batch, MemoryContext, MemoryModel, erfc, observations_from_records
from autotune.search.residual_model import Codes, SelfCheck, corrected, fit_rates
from autotune.space.definition import SearchSpace
from autotune.space.enumerate import configurations, sample, size

POOL = 60_000  # candidates scored at each ask: the whole space up to this size, else a sample
NOISE = {priors.CPU: 0.06, "cuda": 0.015}  # the spread of one measurement of log tokens/s


def measurement_noise(device_kind: str | None) -> float:
    """One measurement's spread of log tokens/s on a device of this kind: a GPU's for "cuda",
    else a CPU's (the wider, where the device is not known)."""
    return NOISE["cuda"] if device_kind == "cuda" else NOISE[priors.CPU]


STOP_GAIN = 0.003  # expected gain of the best next trial (fraction of tokens/s) below which to stop
MIN_FIT = 0.5  # proposals need at least this chance to fit the limit less the headroom ...
EDGE_FIT = 0.25  # ... or this much, at the memory edge, when a fit would gain EDGE_GAIN or more:
EDGE_GAIN = 0.01  # the largest budget that fits usually sits at the limit, and an OOM costs one short run
EDGE_MISSES = 2  # ... until this many configurations of the study went over the limit: then only the likely
COST_WEIGHT = 0.25  # expected gain per second**COST_WEIGHT: cheaper trials first, at equal promise
FIRST_COST_WEIGHT = 0.05  # the first trial: log tokens/s given up per e-fold of expected seconds
CLEARLY_WORSE = 0.03  # a short window this far below the best, beyond its interval, is not timed in full
CORRECTED = 1500  # candidates whose prediction the residual GP corrects at most (the most promising)

HOST_ONLY = tuple(k.name for k in registry.knobs_of() if k.host_only)
LOADER = tuple(k.name for k in registry.knobs_of() if k.role is registry.Role.LOADER)
MEMORY_KNOBS = ("token_budget", "checkpoint_layers", "loss_impl")

# Outcomes that say nothing against a configuration: it may be proposed again (a prediction may
# change with more trials; a kill from outside or an interruption was no fault of its own).
AGAIN = (outcomes.PREDICTED_OVER_LIMIT, outcomes.KILLED, outcomes.INTERRUPTED)

# Stages, as the summary counts them: what a proposal changes against the best so far.
EXPERT, KERNELS, BUDGET, DATA_LOADER = "expert prior", "kernels", "budget and memory", "data loader"
REMEASURE = "measured again"  # a configuration whose one reading was a bad one (SelfCheck.outliers)


@dataclass(frozen=True)
class Proposal:
    params: dict[str, Any]  # the Optuna params that reproduce it (sampling.suggest)
    config: dict[str, Any]  # its knobs (TrainConfig.to_dict())
    stage: str
    reason: str
    predicted_tokens_per_sec: float
    p_fit: float
    predicted_peak_bytes: int | None  # None: a planner that predicts the chance to fit, not the bytes
    expected_seconds: float
    prune_below: float | None = None  # tokens/s: a short window clearly below this is not timed in full

    def to_attrs(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "reason": self.reason,
            "predicted_tokens_per_sec": self.predicted_tokens_per_sec,
            "p_fit": self.p_fit,
            "predicted_peak_memory_bytes": self.predicted_peak_bytes,
            "expected_seconds": self.expected_seconds,
        }


@dataclass(frozen=True)
class Stop:
    reason: str


def config_key(knobs: Mapping[str, Any]) -> str:
    return json.dumps(dict(knobs), sort_keys=True)


def graph_key(knobs: Mapping[str, Any]) -> str:
    """What torch.compile traces depends on: every knob but the host-only ones (DataLoader)."""
    return json.dumps({k: v for k, v in knobs.items() if k not in HOST_ONLY}, sort_keys=True)


@dataclass
class Observed:
    """What a study's finished trials say, as the models read them."""

    measured: list[Any] = field(default_factory=list)  # records with a throughput
    done: set[str] = field(default_factory=set)  # configurations not to propose again
    graphs: set[str] = field(default_factory=set)  # graphs compiled in some trial
    best: Any = None  # the best feasible record
    data_wait: float | None = None  # the best's share of time waiting for data
    cost_scale: float = 1.0  # measured seconds / the prior's, over the study's trials
    last_improved: bool = False  # the last finished trial beat the best before it by more than the noise
    n_finished: int = 0
    over_limit: int = 0  # trials that went over the memory limit (OOM, or a peak over it)
    # configurations predicted over the limit and not run, with no peak measured since to change that
    predicted_over: set[str] = field(default_factory=set)
    # (knob, value) a run-time "unsupported" named (a kernel the device lacks): how many trials with
    # it came back unsupported, and how many with it ran
    refused: dict[tuple[str, Any], list[int]] = field(default_factory=dict)


class Planner:
    """Proposals for one study: its space, device, memory limit and the model's shape."""

    def __init__(
        self,
        space: SearchSpace,
        *,
        device_kind: str,
        compute_capability: tuple[int, int] | None,
        memory: MemoryContext,
        feasible_limit: int,
        valid: Callable[[TrainConfig], bool] = lambda cfg: True,
        seed: int = 0,
        pool: int = POOL,
    ) -> None:
        self.space, self.device_kind, self.feasible_limit, self.seed = space, device_kind, feasible_limit, seed
        self.device = priors.device_class(device_kind, compute_capability)
        self.noise = measurement_noise(device_kind)
        self.valid, self.pool_size = valid, pool
        self.memory_context = memory
        self.check: SelfCheck | None = None  # how well the last fit predicted its own trials
        self._build(self._candidates(around=()))

    # --- candidates ----------------------------------------------------------------------------------

    def _candidates(self, around: Sequence[TrainConfig]) -> list[tuple[dict[str, Any], TrainConfig]]:
        if size(self.space, cap=self.pool_size) <= self.pool_size:
            pairs = list(configurations(self.space))
            self.exhaustive = True
        else:
            seeds = list(around) or [c for c in [self._preferred()] if c is not None]
            pairs = sample(self.space, self.pool_size, self.seed, around=seeds)
            self.exhaustive = False
        return [(p, c) for p, c in pairs if self.space.violation(c) is None and self.valid(c)]

    def _preferred(self) -> TrainConfig | None:
        """What experts prefer on this device class, knob by knob, within the space (the registry's
        `prefer`): a seed whose neighbours join a sampled pool, so the priors' favourite is in it."""
        from autotune.space.enumerate import dimension_values

        kind = "cpu" if self.device_kind == "cpu" else "cuda"
        values = dict(self.space.fixed)
        for name, dim in self.space.dimensions.items():
            offered = dimension_values(self.space, dim)
            prefer = registry.knob(name).prefer if name in registry.BY_NAME else {}
            wanted = [v for v in prefer.get(self.device, prefer.get(kind, ())) if v in offered]
            values[name] = wanted[0] if wanted else max(offered) if name == "token_budget" else offered[0]
        try:
            from autotune.space.sampling import to_config

            return to_config(values)
        except Exception:  # noqa: BLE001 - preferences that break a rule together: no seed
            return None

    def _build(self, pairs: list[tuple[dict[str, Any], TrainConfig]]) -> None:
        self.params = [p for p, _ in pairs]
        self.configs = [c.to_dict() for _, c in pairs]
        self.keys = [config_key(c) for c in self.configs]
        self.index = {k: i for i, k in enumerate(self.keys)}
        self.graphs = [graph_key(c) for c in self.configs]
        self.columns = Columns.build(self.configs, device=self.device, n_layer=self.space.n_layer or 1)
        self.X = self.columns.matrix(self.configs)
        self.codes = Codes(sorted({k for c in self.configs for k in c}))
        self.C = self.codes.encode(self.configs)
        self.compile_s = np.array([priors.compile_seconds(c) for c in self.configs])
        self.memory = MemoryModel(self.memory_context, self.feasible_limit, self.configs)
        self.batch = Batch(self.memory, self.configs)
        self._fit_key = None  # a new pool: nothing fitted to it yet

    def extend(self, around: Sequence[TrainConfig]) -> None:
        """For a sampled (not listed) space: the neighbours of these configurations join the pool."""
        if not self.exhaustive:
            self._build(self._candidates(around))

    def _follow_the_best(self, seen: Observed) -> None:
        """A space too large to list: each new best brings its neighbours (one knob away) into the
        pool, so the search can always move from it one knob at a time."""
        if self.exhaustive or seen.best is None:
            return
        key = config_key(seen.best.config)
        if key != getattr(self, "_around", None):
            self._around = key
            self.extend([TrainConfig.from_dict(seen.best.config)])

    # --- reading the study ----------------------------------------------------------------------------

    def observe(self, records: Sequence[Any], running: Sequence[Mapping[str, Any]] = ()) -> Observed:
        seen = Observed()
        best_value = None
        ratios = []
        finished = sorted((r for r in records if r.finished and r.reference is None), key=lambda r: r.number)
        for r in finished:
            seen.n_finished += 1
            if r.config is None:
                continue
            key = config_key(r.config)
            if r.outcome not in AGAIN:
                seen.done.add(key)
            if r.duplicate_of is not None:
                continue
            if r.outcome in outcomes.MEASURED or r.outcome in outcomes.INFEASIBLE:
                seen.graphs.add(graph_key(r.config))
            if r.outcome in (outcomes.OOM, outcomes.OVER_MEMORY_LIMIT):
                seen.over_limit += 1
            if r.outcome is outcomes.PREDICTED_OVER_LIMIT:
                seen.predicted_over.add(key)
            elif r.peak_memory_bytes or r.outcome is outcomes.OOM:  # a peak that may move the predictions
                seen.predicted_over.clear()
            if r.outcome is outcomes.UNSUPPORTED:
                culprit = _culprit(r)
                if culprit is not None:
                    seen.refused.setdefault(culprit, [0, 0])[0] += 1
            if r.measured and r.tokens_per_sec and r.tokens_per_sec > 0:
                seen.measured.append(r)
                if r.wall_s:
                    ratios.append(r.wall_s / self._prior_seconds(r.config, warm=False))
            if r.feasible and r.tokens_per_sec:
                value = math.log(r.tokens_per_sec)
                seen.last_improved = best_value is None or value > best_value + 2 * self.noise
                if best_value is None or value > best_value:
                    best_value, seen.best = value, r
            else:
                seen.last_improved = False
        for c in running:
            seen.done.add(config_key(c))
        for (knob, value), counts in seen.refused.items():
            counts[1] = sum(1 for r in seen.measured if _value_key(r.config.get(knob)) == value)
        if seen.best is not None and seen.best.measurement is not None:
            seen.data_wait = seen.best.measurement.data_wait_fraction
        if ratios:
            seen.cost_scale = float(np.median(ratios))
        return seen

    def _prior_seconds(self, knobs: Mapping[str, Any], *, warm: bool) -> float:
        kind = "cpu" if self.device_kind == "cpu" else "cuda"
        compile_s = priors.compile_seconds(knobs) * (priors.WARM_COMPILE if warm else 1.0)
        return priors.PROCESS_S[kind] + priors.TIMED_S[kind] + compile_s

    def _loader_sd(self, seen: Observed) -> float:
        if seen.data_wait is None:
            return priors.LOADER_SD_UNKNOWN
        return priors.LOADER_SD_WAITING if seen.data_wait > priors.DATA_WAIT else priors.LOADER_SD

    # --- the models --------------------------------------------------------------------------------

    def fit(self, records: Sequence[Any], seen: Observed) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(mean, sd) of every candidate's log tokens/s, and its chance to fit (the last fit is kept:
        the stop rule after a trial and the proposal before the next read the same trials)."""
        key = tuple((r.number, r.outcome, r.tokens_per_sec, r.peak_memory_bytes) for r in records if r.finished)
        if getattr(self, "_fit_key", None) == (key, self._loader_sd(seen)):
            return self._fitted
        self._fitted = self._fit(records, seen)
        self._fit_key = (key, self._loader_sd(seen))
        return self._fitted

    def _fit(self, records: Sequence[Any], seen: Observed) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        prior_mean, prior_sd = self.columns.throughput_prior(self._loader_sd(seen))
        rows = np.array([self.columns.row(r.config) for r in seen.measured]).reshape(
            len(seen.measured), len(prior_mean)
        )
        y = np.array([math.log(r.tokens_per_sec) for r in seen.measured])
        noise = np.array([self.noise * (2.0 if r.unstable else 1.0) for r in seen.measured])
        codes = self.codes.encode([r.config for r in seen.measured])
        posterior, residual, check = fit_rates(rows, y, noise, codes, prior_mean, prior_sd, self.noise)
        self.check = check
        mean = self.X @ posterior.mean
        chol = np.linalg.cholesky(posterior.cov + 1e-12 * np.eye(len(prior_mean)))
        var = np.square(self.X @ chol).sum(axis=1)
        near = self._worth_correcting(mean, np.sqrt(var), residual.tau, seen)
        mean, var = corrected(mean, var, self.C, residual, near)
        self.memory.fit(observations_from_records(records))
        self.supported = self._p_supported(seen)
        return mean, np.sqrt(var), self.batch.p_fit() * self.supported

    def _worth_correcting(self, mean: np.ndarray, sd: np.ndarray, tau: float, seen: Observed) -> np.ndarray:
        """The candidates whose prediction the residual GP is worth computing for: those that could
        still beat the best (at most CORRECTED of them, the most promising): the rest stay far
        below it whatever their residual, and their sd keeps tau of doubt."""
        reach = mean + 3.0 * np.sqrt(np.square(sd) + tau**2)
        if seen.best is not None:
            could = reach >= math.log(seen.best.tokens_per_sec) - 0.01
        else:
            could = np.ones(len(mean), dtype=bool)
        if could.sum() > CORRECTED:
            cut = np.partition(np.where(could, reach, -np.inf), -CORRECTED)[-CORRECTED]
            could &= reach >= cut
        return could

    # --- proposing -------------------------------------------------------------------------------------

    def propose(self, records: Sequence[Any], running: Sequence[Mapping[str, Any]] = ()) -> Proposal | Stop:
        seen = self.observe(records, running)
        self._follow_the_best(seen)
        mean, sd, p_fit = self.fit(records, seen)
        again = self._again(seen)
        open_ = self._open(seen, again)
        if not open_.any():
            return Stop(f"every configuration of the space was tried ({len(self.keys)})")
        fits = open_ & self._eligible(mean, sd, p_fit, seen)
        if not fits.any():
            if seen.best is not None:
                return Stop("no untried configuration is likely to fit the memory limit")
            fits = open_ & (p_fit >= p_fit[open_].max() * 0.999)  # the most likely to fit, to learn from it
        warm = np.array([g in seen.graphs for g in self.graphs])
        seconds = self._seconds(warm, seen.cost_scale)
        if seen.best is None:
            # Nothing feasible measured yet: the best expected log tokens/s among what likely fits.
            # Time still counts: a compile of minutes must promise more than one of seconds.
            score = mean + np.log(np.maximum(p_fit, 1e-9)) - FIRST_COST_WEIGHT * np.log(seconds)
            score = np.where(fits, score, -np.inf)
            gain = None
        else:
            gain = expected_improvement(mean, sd, math.log(seen.best.tokens_per_sec)) * p_fit
            score = np.where(fits, gain / np.power(seconds, COST_WEIGHT), -np.inf)
        i = int(np.argmax(score))
        if seen.best is None and self.keys[i] in seen.predicted_over:
            # Proposing it again would be refused again: nothing measured since changed its prediction.
            return Stop(
                f"nothing is likely to fit the memory limit: the likeliest, {self._describe(i, seen)}, "
                f"{p_fit[i]:.0%} likely to fit, was predicted over it: raise the limit, or give the space smaller "
                "budgets, checkpointing or the chunked loss"
            )
        return self._proposal(i, seen, mean, sd, p_fit, seconds, gain, again.get(self.keys[i]))

    def _again(self, seen: Observed) -> dict[str, Any]:
        return bad_readings(self.check, seen.measured)

    def _open(self, seen: Observed, again: Mapping[str, Any]) -> np.ndarray:
        return np.array([k not in seen.done or k in again for k in self.keys])

    def stop_reason(self, records: Sequence[Any], running: Sequence[Mapping[str, Any]] = ()) -> str | None:
        """Why to stop now, or None to go on."""
        seen = self.observe(records, running)
        if seen.best is None or seen.last_improved:
            return None
        mean, sd, p_fit = self.fit(records, seen)
        if not self.check.trusted:  # it mispredicts its own trials: its "nothing left" means nothing
            return None
        open_ = self._open(seen, self._again(seen)) & self._eligible(mean, sd, p_fit, seen)
        if not open_.any():
            return f"every configuration likely to fit was tried; {self.check.text()}"
        gain = expected_improvement(mean, sd, incumbent(mean, self.index, seen)) * p_fit
        best_gain = float(gain[open_].max())
        if best_gain >= STOP_GAIN:
            return None
        j = int(np.argmax(np.where(open_, gain, -np.inf)))
        return (
            f"no untried configuration is expected to beat #{seen.best.number} by more than {100 * STOP_GAIN:.1f} % "
            f"(the most promising, {self._describe(j, seen)}: {100 * best_gain:.2f} % expected, "
            f"{p_fit[j]:.0%} likely to fit); {self.check.text()}"
        )

    def _eligible(self, mean: np.ndarray, sd: np.ndarray, p_fit: np.ndarray, seen: Observed) -> np.ndarray:
        """Candidates worth a trial as far as memory goes: likely to fit, or at the memory edge with a
        material gain if they do (the chance of an OOM is priced in the score, in seconds). Only
        memory's doubt makes an edge: a kernel the device refused stays behind MIN_FIT."""
        likely = p_fit >= MIN_FIT
        if seen.best is None or seen.over_limit >= EDGE_MISSES:
            return likely
        gain_if_fits = expected_improvement(mean, sd, math.log(seen.best.tokens_per_sec))
        return likely | ((p_fit >= EDGE_FIT) & (self.supported >= 1.0) & (gain_if_fits >= EDGE_GAIN))

    def _p_supported(self, seen: Observed) -> np.ndarray:
        """The chance a candidate runs at all, from the kernels the device refused at run time: a
        knob value named by an unsupported trial's reason, (ran + 1) / (ran + refused + 1)."""
        p = np.ones(len(self.configs))
        for (knob, value), (refused, ran) in seen.refused.items():
            has = np.array([_value_key(c.get(knob)) == value for c in self.configs])
            p[has] *= (ran + 1) / (ran + refused + 1)
        return p

    def _seconds(self, warm: np.ndarray, scale: float) -> np.ndarray:
        kind = "cpu" if self.device_kind == "cpu" else "cuda"
        compile_s = self.compile_s * np.where(warm, priors.WARM_COMPILE, 1.0)
        return scale * (priors.PROCESS_S[kind] + priors.TIMED_S[kind] + compile_s)

    def _proposal(self, i, seen, mean, sd, p_fit, seconds, gain, bad_reading=None) -> Proposal:
        config = self.configs[i]
        stage = EXPERT if seen.best is None and not seen.measured else self._stage(config, seen)
        peak = self.memory.predict(config)
        tps = math.exp(mean[i])
        if bad_reading is not None:
            stage = REMEASURE
            reason = remeasure_reason(bad_reading, tps, sd[i])
        elif gain is None:
            reason = f"the priors' best guess likely to fit ({p_fit[i]:.0%}): {tps:,.0f} tok/s expected"
        else:
            reason = (
                f"{100 * gain[i]:.1f} % expected gain over #{seen.best.number} "
                f"({tps:,.0f} +- {100 * sd[i]:.0f} % tok/s, {p_fit[i]:.0%} likely to fit, ~{seconds[i]:.0f} s)"
            )
        prune = seen.best.tokens_per_sec * (1 - CLEARLY_WORSE) if seen.best is not None else None
        return Proposal(
            dict(self.params[i]),
            dict(config),
            stage,
            reason,
            tps,
            float(p_fit[i]),
            peak.peak_bytes,
            float(seconds[i]),
            prune,
        )

    def _stage(self, config: Mapping[str, Any], seen: Observed) -> str:
        if seen.best is None:
            return BUDGET
        changed = {k for k, v in config.items() if seen.best.config.get(k) != v}
        if changed and changed <= set(LOADER):
            return DATA_LOADER
        if changed and changed <= set(MEMORY_KNOBS):
            return BUDGET
        return KERNELS

    def _describe(self, i: int, seen: Observed) -> str:
        """What the candidate changes against the best; with no best, its memory's knobs."""
        config = self.configs[i]
        if seen.best is None:
            return ", ".join(
                f"{k}={registry.value_text(config[k])}" for k in (*MEMORY_KNOBS, "amp_dtype") if k in config
            )
        changed = [f"{k}={registry.value_text(v)}" for k, v in config.items() if seen.best.config.get(k) != v]
        return ", ".join(changed) or "the same"


def _value_key(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _culprit(record: Any) -> tuple[str, Any] | None:
    """The knob value an unsupported trial's reason names ("sdpa_backend: ...", the form of
    UnsupportedConfig, or "sdpa_backend=cudnn: ..."), from its configuration where only the knob is named."""
    head = (record.reason or "").split(":", 1)[0].strip()
    knob = head.partition("=")[0]
    if knob not in registry.BY_NAME or record.config is None or knob not in record.config:
        return None
    return knob, _value_key(record.config[knob])  # the value it ran with: the one refused


def bad_readings(check: SelfCheck | None, measured: Sequence[Any]) -> dict[str, Any]:
    """Configurations whose one reading the last fit judged a bad one (far below what every other
    trial predicts of it), each with that reading: open to a proposal again, once. The reading
    counts with a wide noise, so the model says what the configuration is likely worth; if that
    could beat the best, only a fresh measurement tells (a bad reading of the best would
    otherwise lose it for good). `measured`: the trials in the order the fit read them."""
    if check is None or not check.outliers:
        return {}
    readings = Counter(config_key(r.config) for r in measured)
    bad = (measured[i] for i in check.outliers if i < len(measured))
    return {config_key(r.config): r for r in bad if readings[config_key(r.config)] == 1}


def remeasure_reason(bad_reading: Any, predicted: float, sd: float) -> str:
    """Why a configuration is proposed again: its one reading was a bad one."""
    return (
        f"#{bad_reading.number} read {bad_reading.tokens_per_sec:,.0f} tok/s, far below what the other trials "
        f"predict of it ({predicted:,.0f} +- {100 * sd:.0f} %): measured again"
    )


def incumbent(mean: np.ndarray, index: Mapping[str, int], seen: Any) -> float:
    """The level the stop rule asks an untried candidate to beat (log tokens/s): what the model
    believes the best measured configuration delivers, the highest posterior mean (`mean`, by
    candidate; `index`, a configuration's key to its candidate) among the feasible configurations
    measured, never above the best reading. The best single reading is biased upward by the noise
    (the winner's curse): an improvement expected over a lucky one undervalues every untried
    candidate and stops the search early. Replayed on the whole landscape table (72 cells, 10
    seeds), 619 runs of 720 stopped within 3 % against 607 with the reading's level, for 1.5 more
    trials at the median cell. Proposals keep the reading's level: with this one they ranked the
    candidates worse (47 cells of 72 stopped right in 9 of 10 seeds, against 49)."""
    best = math.log(seen.best.tokens_per_sec)
    believed = [index[k] for k in {config_key(r.config) for r in seen.measured if r.feasible} if k in index]
    return min(best, float(mean[believed].max())) if believed else best


def expected_improvement(mean: np.ndarray, sd: np.ndarray, best: float) -> np.ndarray:
    """E[max(0, f - best)] for f ~ N(mean, sd): in the log, the expected relative gain."""
    z = (mean - best) / sd
    pdf = np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    cdf = 0.5 * erfc(-z / math.sqrt(2))
    return np.maximum(0.0, (mean - best) * cdf + sd * pdf)
