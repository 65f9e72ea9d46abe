"""The planner of a generation study (`search --task generate`): training's reasoning
(`search.planner`) on generation's space, through the same sampler (`search.sampler`).

Every configuration of the space is a candidate (a few hundred on a CPU, tens of thousands on a
GPU: `GenerationSpace.configurations`). Before each trial it fits, to every measured trial (the
references too, where the space holds their configuration):

- output tokens/s: log tokens/s = experts' sum + a Gaussian process of its residuals
  (`search.residual_model`, as training's). The sum has a column per knob value, its prior the
  registry's `prefer` (the first preferred value a little ahead, every value uncertain), and the
  log of the batch: a doubling pays until the device saturates, which the measurements say;
- each figure a bound is set on (the peak memory against the limit less the headroom, and
  `--max-p99-token-latency`, `--max-ttft`): log figure = a linear model over the same columns,
  and from it the chance that a candidate stays within the bound.

It proposes the candidate with the largest expected improvement over the best feasible tokens/s,
times its chance to meet every bound, per expected second (a compiled decode costs its compile),
and stops as training's planner stops: when no candidate is expected to gain more than
`planner.STOP_GAIN`, never right after a trial that improved the best by more than the noise,
and never while the model mispredicts its own leading trials; the stop line says how well it
predicted them. A reading far below what every other trial predicts is measured again, once.

A configuration whose decode recompiled while timed, or whose tokens diverged, is done: it is
not proposed again (the run says what is wrong with it; nothing says its neighbours share it).
Torch-free; numpy."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from autotune import registry
from autotune.knobs.support import DeviceCapabilities
from autotune.measure import outcomes
from autotune.search.generation_space import GenerationSpace
from autotune.search.memory_model import erfc
from autotune.search.planner import (
    AGAIN,
    CLEARLY_WORSE,
    CORRECTED,
    COST_WEIGHT,
    EXPERT,
    FIRST_COST_WEIGHT,
    KERNELS,
    MIN_FIT,
    REMEASURE,
    STOP_GAIN,
    Proposal,
    Stop,
    bad_readings,
    config_key,
    expected_improvement,
    incumbent,
    measurement_noise,
    remeasure_reason,
)
from autotune.search.residual_model import Codes, SelfCheck, corrected, fit_rates
from autotune.search.throughput_model import Posterior, bayesian_linear
from autotune.study.record import P99_TOKEN_LATENCY, TTFT

BATCH = "batch and prompt bucket"  # the stage of a proposal that changes only these against the best
SHAPE_KNOBS = ("batch_size", "prompt_bucket")

INTERCEPT_SD = 20.0  # the scale of tokens/s, memory or latency: the measurements set it
PREFERRED = (0.05, 0.15)  # a knob's first preferred value (registry `prefer`): a little ahead, unsure
OTHER = (0.0, 0.15)  # any other value
BATCH_SLOPE = (0.5, 0.4)  # log tokens/s per doubling of the batch: decode is memory-bound until it saturates
FIGURE_SLOPE = (0.3, 1.0)  # log memory or latency per doubling of the batch
FIGURE_EFFECT_SD = 0.5  # a knob value's effect on log memory or latency
FIGURE_NOISE = 0.05  # the spread of one reading of log memory or latency
COMPILE_S = {"cpu": 30.0, "cuda": 60.0}  # a compiled decode's compile, before its timed window
PROCESS_S = {"cpu": 6.0, "cuda": 15.0}  # a trial's process start, model build and timed generations

# Outcomes that say something in the configuration is unusable here, whatever its speed.
UNUSABLE = (outcomes.DIVERGED, outcomes.RECOMPILED, outcomes.UNSUPPORTED)

MEMORY = "memory"
BOUND_FIGURES = {P99_TOKEN_LATENCY: "token_latency_p99_s", TTFT: "ttft_p99_s"}


@dataclass
class Seen:
    """What a generation study's finished trials say, as the models read them."""

    finished: list[Any] = field(default_factory=list)  # records with a configuration, in the space
    measured: list[Any] = field(default_factory=list)  # of them, those with a throughput
    done: set[str] = field(default_factory=set)  # configurations not to propose again
    best: Any = None  # the best feasible record
    last_improved: bool = False


class GenerationPlanner:
    """Proposals for one generation study: its space, device, memory limit and latency bounds."""

    def __init__(
        self,
        space: GenerationSpace,
        caps: DeviceCapabilities,
        *,
        feasible_limit: int | None,
        bounds: Mapping[str, float | None] | None = None,
        seed: int = 0,
    ) -> None:
        self.space, self.seed = space, seed
        self.device_kind = "cpu" if caps.kind == "cpu" else "cuda"
        self.noise = measurement_noise(self.device_kind)
        # Training's 0.3 % is a fifth of a GPU reading's spread; a CPU's readings spread 6 %, and a
        # gain of a twentieth of that is one no run could show: a fifth of the noise on either.
        self.stop_gain = max(STOP_GAIN, self.noise / 5)
        self.bounds = {MEMORY: float(feasible_limit)} if feasible_limit else {}
        self.bounds.update({name: float(b) for name, b in (bounds or {}).items() if b is not None})
        self.check: SelfCheck | None = None
        self.params: list[dict[str, Any]] = []
        self.configs: list[dict[str, Any]] = []
        self.index: dict[str, int] = {}
        for params, cfg in space.configurations(caps):
            knobs = cfg.to_dict()
            key = config_key(knobs)
            if key not in self.index:
                self.index[key] = len(self.configs)
                self.params.append(params)
                self.configs.append(knobs)
        self.keys = list(self.index)
        self.columns = self._columns()
        self.X = self.matrix(self.configs)
        self.codes = Codes(sorted(space.choices))
        self.C = self.codes.encode(self.configs)
        self.seconds = np.array([PROCESS_S[self.device_kind] + self._compile_s(c) for c in self.configs])

    # --- the columns -----------------------------------------------------------------------------

    def _columns(self) -> list[tuple[str, Any]]:
        """An intercept, log2 of the batch, and a column per searched value that is not its knob's first."""
        columns: list[tuple[str, Any]] = [("intercept", None), ("log2_batch", None)]
        for name, values in self.space.choices.items():
            columns += [(name, value) for value in values[1:]]
        return columns

    def matrix(self, configs: Sequence[Mapping[str, Any]]) -> np.ndarray:
        X = np.zeros((len(configs), len(self.columns)))
        at = {column: j for j, column in enumerate(self.columns)}
        for i, config in enumerate(configs):
            X[i, 0] = 1.0
            X[i, 1] = math.log2(max(1, int(config.get("batch_size", 1))))
            for name, value in config.items():
                j = at.get((name, value))
                if j is not None:
                    X[i, j] = 1.0
        return X

    def _throughput_prior(self) -> tuple[np.ndarray, np.ndarray]:
        mean, sd = np.zeros(len(self.columns)), np.zeros(len(self.columns))
        mean[0], sd[0] = 0.0, INTERCEPT_SD
        mean[1], sd[1] = BATCH_SLOPE
        for j, (name, value) in enumerate(self.columns[2:], start=2):
            mean[j], sd[j] = self._value_prior(name, value)
            first = self.space.choices[name][0]
            mean[j] -= self._value_prior(name, first)[0]  # relative to the knob's first value
        return mean, sd

    def _value_prior(self, name: str, value: Any) -> tuple[float, float]:
        prefer = registry.knob(name).prefer if name in registry.BY_NAME else {}
        wanted = [v for v in prefer.get(self.device_kind, ()) if v in self.space.choices.get(name, ())]
        return PREFERRED if wanted and wanted[0] == value else OTHER

    def _figure_prior(self) -> tuple[np.ndarray, np.ndarray]:
        mean, sd = np.zeros(len(self.columns)), np.full(len(self.columns), FIGURE_EFFECT_SD)
        sd[0] = INTERCEPT_SD
        mean[1], sd[1] = FIGURE_SLOPE
        return mean, sd

    def _compile_s(self, config: Mapping[str, Any]) -> float:
        return COMPILE_S[self.device_kind] if config.get("decode_compile", "none") != "none" else 0.0

    # --- reading the study ---------------------------------------------------------------------

    def observe(self, records: Sequence[Any], running: Sequence[Mapping[str, Any]] = ()) -> Seen:
        seen = Seen()
        best_value = None
        for r in sorted((r for r in records if r.finished and r.config), key=lambda r: r.number):
            key = config_key(r.config)
            if r.outcome not in AGAIN:
                seen.done.add(key)
            if r.duplicate_of is not None or key not in self.index:
                continue  # a reference the space does not hold: its columns would mislead the sum
            seen.finished.append(r)
            if r.measured and r.tokens_per_sec and r.tokens_per_sec > 0:
                seen.measured.append(r)
            if r.feasible and r.tokens_per_sec:
                value = math.log(r.tokens_per_sec)
                seen.last_improved = r.reference is None and (best_value is None or value > best_value + 2 * self.noise)
                if best_value is None or value > best_value:
                    best_value, seen.best = value, r
            else:
                seen.last_improved = False
        seen.done.update(config_key(c) for c in running)
        return seen

    # --- the models ------------------------------------------------------------------------------

    def fit(self, records: Sequence[Any], seen: Seen) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(mean, sd) of every candidate's log tokens/s, and its chance to meet every bound."""
        key = tuple((r.number, r.outcome, r.tokens_per_sec) for r in records if r.finished)
        if getattr(self, "_fit_key", None) != key:
            self._fitted, self._fit_key = self._fit(records, seen), key
        return self._fitted

    def _fit(self, records: Sequence[Any], seen: Seen) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        prior_mean, prior_sd = self._throughput_prior()
        rows = self.matrix([r.config for r in seen.measured])
        y = np.array([math.log(r.tokens_per_sec) for r in seen.measured])
        noise = np.array([self.noise * (2.0 if r.unstable else 1.0) for r in seen.measured])
        codes = self.codes.encode([r.config for r in seen.measured])
        posterior, residual, check = fit_rates(rows, y, noise, codes, prior_mean, prior_sd, self.noise)
        self.check = check
        mean, var = _predict(self.X, posterior)
        near = self._worth_correcting(mean, np.sqrt(var + residual.tau**2), seen)
        mean, var = corrected(mean, var, self.C, residual, near)
        return mean, np.sqrt(var), self._p_within(records) * self._p_usable(seen)

    def _worth_correcting(self, mean: np.ndarray, sd: np.ndarray, seen: Seen) -> np.ndarray:
        """Those that could still beat the best, at most CORRECTED (the residual GP's cost)."""
        reach = mean + 3.0 * sd
        could = reach >= math.log(seen.best.tokens_per_sec) - 0.01 if seen.best else np.ones(len(mean), bool)
        if could.sum() > CORRECTED:
            cut = np.partition(np.where(could, reach, -np.inf), -CORRECTED)[-CORRECTED]
            could &= reach >= cut
        return could

    def _p_usable(self, seen: Seen) -> np.ndarray:
        """The chance a candidate's run is usable at all: a knob value that never ran usable, in
        `bad` trials that diverged, recompiled while timed or were refused at run time, takes a
        candidate with it to 1 / (bad + 1) (float16 leaving the reference's tokens, an autotuned
        decode that recompiles). A value seen in a usable run is cleared: it was not the cause."""
        usable: set[tuple[str, Any]] = set()
        bad: Counter[tuple[str, Any]] = Counter()
        for r in seen.finished:
            pairs = {(k, _hashable(v)) for k, v in r.config.items() if k in self.space.choices}
            if r.outcome in UNUSABLE:
                bad.update(pairs)
            elif r.measured:
                usable |= pairs
        p = np.ones(len(self.configs))
        for (knob, value), count in bad.items():
            if (knob, value) not in usable:
                has = np.array([_hashable(c.get(knob)) == value for c in self.configs])
                p[has] /= count + 1
        return p

    def _p_within(self, records: Sequence[Any]) -> np.ndarray:
        """Each candidate's chance to meet every bound: a log-linear model per bounded figure, fitted
        to the trials that read it (an out-of-memory trial reads "over the limit")."""
        p = np.ones(len(self.configs))
        prior_mean, prior_sd = self._figure_prior()
        for name, bound in self.bounds.items():
            configs, values = [], []
            for r in records:
                figure = _figure(r, name, bound)
                if figure is not None and r.config:
                    configs.append(r.config)
                    values.append(math.log(figure))
            if not values:
                continue  # nothing read yet: no reason to doubt a candidate
            posterior = bayesian_linear(
                self.matrix(configs), np.array(values), np.full(len(values), FIGURE_NOISE), prior_mean, prior_sd
            )
            mean, var = _predict(self.X, posterior)
            z = (math.log(bound) - mean) / np.sqrt(var + FIGURE_NOISE**2)
            p *= 0.5 * erfc(-z / math.sqrt(2))
        return p

    # --- proposing -------------------------------------------------------------------------------

    def propose(self, records: Sequence[Any], running: Sequence[Mapping[str, Any]] = ()) -> Proposal | Stop:
        seen = self.observe(records, running)
        mean, sd, p_within = self.fit(records, seen)
        again = bad_readings(self.check, seen.measured)
        open_ = np.array([k not in seen.done or k in again for k in self.keys], dtype=bool)
        if not open_.any():
            return Stop(f"every configuration of the space was tried ({len(self.keys)})")
        likely = open_ & (p_within >= MIN_FIT)
        if not likely.any():
            if seen.best is not None:
                return Stop(f"no untried configuration is likely to meet {self._bounds_text()}")
            likely = open_ & (p_within >= p_within[open_].max() * 0.999)  # the likeliest, to learn from it
        if seen.best is None:
            score = mean + np.log(np.maximum(p_within, 1e-9)) - FIRST_COST_WEIGHT * np.log(self.seconds)
            gain = None
        else:
            gain = expected_improvement(mean, sd, math.log(seen.best.tokens_per_sec)) * p_within
            score = gain / np.power(self.seconds, COST_WEIGHT)
        i = int(np.argmax(np.where(likely, score, -np.inf)))
        return self._proposal(i, seen, mean, sd, p_within, gain, again.get(self.keys[i]))

    def stop_reason(self, records: Sequence[Any], running: Sequence[Mapping[str, Any]] = ()) -> str | None:
        """Why to stop now, or None to go on."""
        seen = self.observe(records, running)
        if seen.best is None or seen.last_improved:
            return None
        mean, sd, p_within = self.fit(records, seen)
        if self.check is None or not self.check.trusted:  # it mispredicts its own trials
            return None
        again = bad_readings(self.check, seen.measured)
        open_ = np.array([k not in seen.done or k in again for k in self.keys], dtype=bool) & (p_within >= MIN_FIT)
        if not open_.any():
            return f"every configuration likely to meet {self._bounds_text()} was tried; {self.check.text()}"
        gain = expected_improvement(mean, sd, incumbent(mean, self.index, seen)) * p_within
        j = int(np.argmax(np.where(open_, gain, -np.inf)))
        if gain[j] >= self.stop_gain:
            return None
        return (
            f"no untried configuration is expected to beat #{seen.best.number} by more than "
            f"{100 * self.stop_gain:.1f} % "
            f"(the most promising, {self._describe(j, seen)}: {100 * gain[j]:.2f} % expected, "
            f"{p_within[j]:.0%} likely to meet {self._bounds_text()}); {self.check.text()}"
        )

    def _proposal(self, i, seen, mean, sd, p_within, gain, bad_reading=None) -> Proposal:
        config, tps = self.configs[i], math.exp(mean[i])
        if bad_reading is not None:
            stage = REMEASURE
            reason = remeasure_reason(bad_reading, tps, sd[i])
        elif gain is None:
            stage = EXPERT
            likely = f"{p_within[i]:.0%} likely to meet {self._bounds_text()}"
            reason = f"the priors' best guess ({likely}): {tps:,.0f} tok/s expected"
        else:
            changed = {k for k, v in config.items() if seen.best.config.get(k) != v}
            stage = BATCH if changed and changed <= set(SHAPE_KNOBS) else KERNELS
            reason = (
                f"{100 * gain[i]:.1f} % expected gain over #{seen.best.number} ({tps:,.0f} +- {100 * sd[i]:.0f} % "
                f"tok/s, {p_within[i]:.0%} likely to meet {self._bounds_text()}, ~{self.seconds[i]:.0f} s)"
            )
        return Proposal(
            params=dict(self.params[i]),
            config=dict(config),
            stage=stage,
            reason=reason,
            predicted_tokens_per_sec=tps,
            p_fit=float(p_within[i]),
            predicted_peak_bytes=None,  # not predicted in bytes: the chance to meet every bound is p_fit
            expected_seconds=float(self.seconds[i]),
            prune_below=seen.best.tokens_per_sec * (1 - CLEARLY_WORSE) if seen.best is not None else None,
        )

    def _describe(self, i: int, seen: Seen) -> str:
        config = self.configs[i]
        changed = [f"{k}={registry.value_text(v)}" for k, v in config.items() if seen.best.config.get(k) != v]
        return ", ".join(changed) or "the same"

    def _bounds_text(self) -> str:
        names = {MEMORY: "the memory limit", P99_TOKEN_LATENCY: "the p99 token latency bound", TTFT: "the TTFT bound"}
        return " and ".join(names[n] for n in self.bounds) or "no bound"


def _predict(X: np.ndarray, posterior: Posterior) -> tuple[np.ndarray, np.ndarray]:
    """The linear posterior's mean and variance at each row of X."""
    chol = np.linalg.cholesky(posterior.cov + 1e-12 * np.eye(len(posterior.mean)))
    return X @ posterior.mean, np.square(X @ chol).sum(axis=1)


def _figure(r: Any, name: str, bound: float) -> float | None:
    """What trial `r` read of the bounded figure `name` (> 0), or None."""
    if name == MEMORY:
        if r.outcome is outcomes.OOM:
            return bound * 1.1  # over the limit, by how much unknown
        return float(r.peak_memory_bytes) if r.peak_memory_bytes and r.measured else None
    figures = (r.measurement.generation or {}) if r.measurement is not None else {}
    value = figures.get(BOUND_FIGURES[name])
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value
