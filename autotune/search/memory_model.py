"""Peak memory of any configuration, predicted from every measured trial, with an interval, so that
the search proposes only what fits and a configuration sure to break the limit is never run.

The model, in three layers:

1. An analytic prior (`search.priors.analytic_memory`): peak = static + per_token x budget, from
   the model's shape: weights, gradients and AdamW state; activations per token by dtype,
   attention kernel (math keeps the T x T scores) and checkpointed blocks; the logits (standard
   loss) or a chunk of them (chunked); compile's workspaces and CUDA graphs' pools.
2. Two scales fitted to every measured peak (`static` and `per_token` each times a factor,
   least squares on relative error, held near 1 by a prior): what the prior got wrong across
   the board, e.g. the allocator's rounding or a model wider than assumed.
3. A Bayesian linear model of what is left, in the log: a column per memory-relevant knob value,
   per family (every knob equal but the budget) and the log of the budget. Its posterior gives
   each prediction an sd, small for a family measured at two budgets, wider for a knob value no
   trial ran, widest before any measurement (the prior's).

What teaches it: a measured peak (ok, over the limit, diverged: the run's memory is real); an
out-of-memory trial or one stopped over the limit with no figure, as "at least the limit" (a
censored observation: it raises what the model predicts for it, never lowers). Nothing else: a
crash, a timeout, an interruption, a kill from outside or a prediction says nothing about memory.
A trial over the limit also bounds its family for certain: with all other knobs equal, memory
does not fall as the budget grows (`certain_bound`).

On a GPU the limit is the device's memory, which DataLoader knobs do not touch (`host_only` in
the registry), so they are not memory columns there; on a CPU the limit is the process tree's
resident memory, workers included, and they are. Torch-free; numpy only."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from autotune import registry
from autotune.measure import outcomes
from autotune.model.sizes import ModelDims
from autotune.search import priors
from autotune.search.throughput_model import bayesian_linear
from autotune.units import format_bytes

BUDGET, BLOCKS = "token_budget", "checkpoint_layers"
HOST_ONLY_KNOBS = tuple(k.name for k in registry.knobs_of(registry.TRAIN) if k.host_only)
RESIDUAL_SD = 0.04  # a measured peak's own spread, run to run (allocator, NVML's 2 MiB pages)
KNOB_SD, FAMILY_SD, SLOPE_SD = 0.1, 0.05, 0.15
SCALE_PRIOR_SD = 0.35  # how far the two scales may move from 1 on little data
CENSORED_MARGIN = 1.05  # an OOM says "at least the limit": it is taught as 5 % above it
SURE_OVER = 0.02  # P(fit) below this: the configuration is not run (predicted_over_limit)
EXTRAPOLATION_SD = 0.04  # of the log, per doubling of the budget beyond a family's measured ones


@dataclass(frozen=True)
class MemoryContext:
    """What the analytic prior needs: the device kind and the model's shape."""

    device_kind: str
    dims: ModelDims
    heads: int
    seq_len: int
    exact: bool  # the shape is known (a named model, or probed), not guessed from the depth

    @classmethod
    def of(
        cls, device_kind: str, *, model: str | None, n_layer: int | None, seq_len: int | None, dims: ModelDims | None
    ) -> "MemoryContext":
        d, heads, exact = priors.model_dims(model, n_layer, dims)
        return cls(device_kind, d, heads, seq_len or 1024, exact)

    def prior(self, knobs: Mapping[str, Any]) -> priors.MemoryPrior:
        return priors.analytic_memory(
            knobs,
            device_kind=self.device_kind,
            dims=self.dims,
            heads=self.heads,
            seq_len=self.seq_len,
            exact=self.exact,
        )

    def ignored(self) -> tuple[str, ...]:
        """Knobs that cannot move the memory the limit applies to."""
        return HOST_ONLY_KNOBS if self.device_kind == "cuda" else ()


@dataclass(frozen=True)
class MemoryObservation:
    """What one finished trial says about memory. `params`: its knob values. `peak_bytes`: its
    measured peak, None when it never measured one (out of memory, or stopped by the CPU
    watchdog). `over_limit`: it broke the study's limit."""

    params: Mapping[str, Any]
    peak_bytes: int | None
    over_limit: bool
    trial: int | None = None


@dataclass(frozen=True)
class MemoryPrediction:
    """A predicted peak: its median and 95 % interval, the chance it fits the limit less the
    headroom, and what it rests on. `certain`: a bound from an over-limit trial of its family."""

    peak_bytes: int
    low_bytes: int
    high_bytes: int
    p_fit: float
    basis: str
    certain: bool = False
    from_oom: bool = False
    trials: tuple[int, ...] = ()

    @property
    def sure_over(self) -> bool:
        return self.certain or self.p_fit < SURE_OVER

    def constraint(self, limit_bytes: int, headroom: float = 0.0) -> float:
        """The memory constraint to record for it, as a measured one is (a bound from an OOM: how
        far over is unknown)."""
        excess = outcomes.memory_constraint(self.peak_bytes, limit_bytes, headroom)
        return max(excess, outcomes.UNKNOWN_EXCESS) if self.from_oom else excess


def family_key(params: Mapping[str, Any], ignore: Iterable[str] = ()) -> tuple:
    """What a family shares: every knob but the budget (and `ignore`d ones)."""
    skip = {BUDGET} | set(ignore)
    return tuple(sorted((k, _hashable(v)) for k, v in params.items() if k not in skip))


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


class MemoryModel:
    """Fit to a study's observations, then asked of any configuration (one by one: `predict`,
    `p_fit`; or the planner's candidates at once: `Batch`)."""

    def __init__(self, context: MemoryContext, feasible_limit: int, configs: Sequence[Mapping[str, Any]] = ()) -> None:
        self.context, self.feasible_limit = context, feasible_limit
        self.lines: dict[tuple, tuple[float, float, list[int]]] = {}
        self.observations: list[MemoryObservation] = []
        self.columns: dict[tuple, int] = {("intercept",): 0, ("log-budget",): 1}
        for c in configs:
            self._keys(c, create=True)
        self.log_budget_ref = math.log(8192)
        self.posterior = bayesian_linear(
            np.zeros((0, len(self.columns))), np.zeros(0), np.zeros(0), np.zeros(len(self.columns)), self._prior_sd()
        )
        self.family_offset: dict[tuple, tuple[float, float]] = {}  # family -> (mean, variance) of its offset

    # --- columns ------------------------------------------------------------------------------------

    def _keys(self, params: Mapping[str, Any], *, create: bool) -> list[tuple[int, float]]:
        ignore = self.context.ignored()
        keys: list[tuple[tuple, float]] = [(("intercept",), 1.0), (("log-budget",), self._log_budget(params))]
        for knob, value in params.items():
            if knob in ignore or knob == BUDGET:
                continue
            key = ("blocks", len(value or ())) if knob == BLOCKS else ("value", knob, _hashable(value))
            keys.append((key, 1.0))
        out = []
        for key, v in keys:
            j = self.columns.get(key)
            if j is None and create:
                j = self.columns[key] = len(self.columns)
            if j is not None:
                out.append((j, v))
            elif key[0] != "log-budget":
                out.append((-1, KNOB_SD**2))  # a column nobody declared: its prior variance
        return out

    def _log_budget(self, params: Mapping[str, Any]) -> float:
        return math.log(max(1, int(params[BUDGET]))) - getattr(self, "log_budget_ref", math.log(8192))

    def _row(self, params: Mapping[str, Any]) -> tuple[np.ndarray, float]:
        x, extra = np.zeros(len(self.columns)), 0.0
        for j, v in self._keys(params, create=False):
            if j < 0:
                extra += v
            else:
                x[j] += v
        return x, extra

    def _prior_sd(self) -> np.ndarray:
        sd = np.full(len(self.columns), KNOB_SD)
        sd[0] = priors.PRIOR_SD if self.context.exact else 1.5 * priors.PRIOR_SD
        sd[1] = SLOPE_SD
        return sd

    def _base(self, params: Mapping[str, Any]) -> float:
        p = self.context.prior(params)
        return p.static + p.per_token * int(params[BUDGET])

    # --- fitting ----------------------------------------------------------------------------------

    def fit(self, observations: Sequence[MemoryObservation]) -> "MemoryModel":
        self.observations = list(observations)
        for o in self.observations:
            self._keys(o.params, create=True)
        measured = [o for o in self.observations if o.peak_bytes]
        self.lines = _family_lines(measured, self.context.ignored())
        rows, targets = list(measured), [float(o.peak_bytes) for o in measured]
        self._fit_residuals(rows, targets)
        censored = [o for o in self.observations if o.peak_bytes is None and o.over_limit]
        for _ in range(2):  # an OOM predicted to fit: taught "at least the limit", then fitted again
            low = [o for o in censored if self.log_peak(o.params)[0] < math.log(CENSORED_MARGIN * self.feasible_limit)]
            if not low:
                break
            rows, targets = rows + low, targets + [CENSORED_MARGIN * self.feasible_limit] * len(low)
            self._fit_residuals(rows, targets)
        return self

    def _fit_residuals(self, rows: Sequence[MemoryObservation], targets: Sequence[float]) -> None:
        """The shared columns' posterior, then each family's offset from what is left (shrunk
        towards 0 by its prior: a family measured once moves part of the way, twice most of it)."""
        X = np.array([self._row(o.params)[0] for o in rows]).reshape(len(rows), len(self.columns))
        y = np.array([math.log(t) - math.log(self._base(o.params)) for o, t in zip(rows, targets)])
        noise = np.full(len(rows), RESIDUAL_SD)
        self.posterior = bayesian_linear(X, y, noise, np.zeros(len(self.columns)), self._prior_sd())
        residual = y - X @ self.posterior.mean if len(rows) else y
        sums: dict[tuple, list[float]] = {}
        for o, r in zip(rows, residual):
            sums.setdefault(family_key(o.params, self.context.ignored()), []).append(float(r))
        self.family_offset = {}
        for family, rs in sums.items():
            precision = len(rs) / RESIDUAL_SD**2 + 1.0 / FAMILY_SD**2
            self.family_offset[family] = (sum(rs) / RESIDUAL_SD**2 / precision, 1.0 / precision)

    # --- predicting ---------------------------------------------------------------------------------

    def log_peak(self, params: Mapping[str, Any]) -> tuple[float, float]:
        """Mean and sd of the log of the peak of `params` (knob values)."""
        family = family_key(params, self.context.ignored())
        if family in self.lines:
            return _on_line(self.lines[family], int(params[BUDGET]))
        x, extra = self._row(params)
        offset, offset_var = self.family_offset.get(family, (0.0, FAMILY_SD**2))
        mean = math.log(self._base(params)) + float(x @ self.posterior.mean) + offset
        var = float(x @ self.posterior.cov @ x) + extra + offset_var + RESIDUAL_SD**2
        return mean, math.sqrt(var)

    def p_fit(self, params: Mapping[str, Any]) -> float:
        if self.certain_bound(params) is not None:
            return 0.0
        mean, sd = self.log_peak(params)
        return _normal_cdf((math.log(self.feasible_limit) - mean) / sd)

    def certain_bound(self, params: Mapping[str, Any]) -> MemoryObservation | None:
        """A trial of the same family, at a budget no larger, that went over the limit."""
        ignore = self.context.ignored()
        key, budget = family_key(params, ignore), int(params[BUDGET])
        over = [
            o
            for o in self.observations
            if o.over_limit and family_key(o.params, ignore) == key and int(o.params[BUDGET]) <= budget
        ]
        return max(over, key=lambda o: (int(o.params[BUDGET]), o.peak_bytes or 0)) if over else None

    def predict(self, params: Mapping[str, Any]) -> MemoryPrediction:
        """The prediction for `params`, with its interval and its basis, for people."""
        bound = self.certain_bound(params)
        mean, sd = self.log_peak(params)
        peak = int(math.exp(mean))
        low, high = int(math.exp(mean - 1.96 * sd)), int(math.exp(mean + 1.96 * sd))
        used = tuple(o.trial for o in self.observations if o.trial is not None)
        if bound is not None:
            what = f"measured peak {format_bytes(bound.peak_bytes)}" if bound.peak_bytes else "out of memory"
            basis = (
                f"#{bound.trial} at token_budget {bound.params[BUDGET]} went over the limit ({what}); with all other "
                f"knobs equal, memory does not fall as the budget grows to {params[BUDGET]}"
            )
            least = max(bound.peak_bytes or 0, self.feasible_limit + 1)
            return MemoryPrediction(
                least, least, max(high, least), 0.0, basis, True, bound.peak_bytes is None, (bound.trial,)
            )
        n = sum(1 for o in self.observations if o.peak_bytes)
        named = f" (trials {', '.join(f'#{t}' for t in used[:8])}{', ...' if len(used) > 8 else ''})" if used else ""
        basis = (
            f"model of {n} measured peak{'s' if n != 1 else ''}{named} on the analytic prior: {format_bytes(peak)}, "
            f"95 % within {format_bytes(low)}-{format_bytes(high)}"
        )
        return MemoryPrediction(peak, low, high, self.p_fit(params), basis, trials=used)


class Batch:
    """The planner's candidates, predicted at once: their rows, priors and families, made once
    per study; the fitted model's posterior, family offsets and lines applied at each ask."""

    def __init__(self, model: MemoryModel, configs: Sequence[Mapping[str, Any]]) -> None:
        self.model = model
        self.configs = configs
        n, f = len(configs), len(model.columns)
        self.X = np.zeros((n, f))
        self.extra = np.zeros(n)
        self.base = np.zeros(n)
        self.budget = np.array([int(c[BUDGET]) for c in configs], dtype=float)
        self.family_index: dict[tuple, int] = {}
        self.family = np.zeros(n, dtype=np.int64)
        for i, c in enumerate(configs):
            x, extra = model._row(c)
            self.X[i, : len(x)], self.extra[i] = x, extra
            p = model.context.prior(c)
            self.base[i] = math.log(p.static + p.per_token * int(c[BUDGET]))
            key = family_key(c, model.context.ignored())
            self.family[i] = self.family_index.setdefault(key, len(self.family_index))

    def log_peaks(self) -> tuple[np.ndarray, np.ndarray]:
        m = self.model
        f = len(m.posterior.mean)
        X = self.X[:, :f] if self.X.shape[1] >= f else np.pad(self.X, ((0, 0), (0, f - self.X.shape[1])))
        offset = np.zeros(len(self.family_index))
        offset_var = np.full(len(self.family_index), FAMILY_SD**2)
        for key, (mean, var) in m.family_offset.items():
            j = self.family_index.get(key)
            if j is not None:
                offset[j], offset_var[j] = mean, var
        mean = self.base + X @ m.posterior.mean + offset[self.family]
        chol = np.linalg.cholesky(m.posterior.cov + 1e-12 * np.eye(f))
        var = np.square(X @ chol).sum(axis=1) + self.extra + offset_var[self.family]
        sd = np.sqrt(var + RESIDUAL_SD**2)
        for key, line in m.lines.items():  # a family measured at two budgets: its own line
            j = self.family_index.get(key)
            if j is None:
                continue
            rows = np.nonzero(self.family == j)[0]
            fixed, slope, budgets = line
            peak = np.maximum(1.0, fixed + slope * self.budget[rows])
            beyond = np.maximum(
                0.0, np.maximum(np.log2(self.budget[rows] / budgets[-1]), np.log2(budgets[0] / self.budget[rows]))
            )
            mean[rows] = np.log(peak)
            sd[rows] = np.sqrt(RESIDUAL_SD**2 + (EXTRAPOLATION_SD * beyond) ** 2)
        return mean, sd

    def p_fit(self) -> np.ndarray:
        mean, sd = self.log_peaks()
        z = (math.log(self.model.feasible_limit) - mean) / sd
        p = 0.5 * erfc(-z / math.sqrt(2))
        # A family member at a budget no larger went over the limit: certainly over.
        ignore = self.model.context.ignored()
        for o in self.model.observations:
            if o.over_limit:
                j = self.family_index.get(family_key(o.params, ignore))
                if j is not None:
                    p[(self.family == j) & (self.budget >= int(o.params[BUDGET]))] = 0.0
        return p


def _family_lines(measured: Sequence[MemoryObservation], ignore: Iterable[str]) -> dict[tuple, tuple]:
    """Each family measured at two budgets or more: its own least-squares line, peak = fixed +
    per_token x budget (slope held at or above 0), with its budgets. Within a family a line
    extrapolated from two points over-predicted the recorded CPU sweep's peaks by at most 9.8 %."""
    points: dict[tuple, list[tuple[int, int]]] = {}
    for o in measured:
        points.setdefault(family_key(o.params, ignore), []).append((int(o.params[BUDGET]), int(o.peak_bytes)))
    lines = {}
    for family, pts in points.items():
        budgets = sorted({b for b, _ in pts})
        if len(budgets) < 2:
            continue
        n = len(pts)
        mb, mp = sum(b for b, _ in pts) / n, sum(p for _, p in pts) / n
        slope = sum((b - mb) * (p - mp) for b, p in pts) / sum((b - mb) ** 2 for b, _ in pts)
        slope = max(0.0, slope)
        lines[family] = (mp - slope * mb, slope, budgets)
    return lines


def _on_line(line: tuple, budget: int) -> tuple[float, float]:
    """(mean, sd) of the log peak at `budget` on a family's line: tight between its budgets, wider
    the further it extrapolates (EXTRAPOLATION_SD per doubling beyond them)."""
    fixed, slope, budgets = line
    peak = max(1.0, fixed + slope * budget)
    beyond = max(0.0, math.log2(budget / budgets[-1]), math.log2(budgets[0] / budget))
    return math.log(peak), math.sqrt(RESIDUAL_SD**2 + (EXTRAPOLATION_SD * beyond) ** 2)


def observations_from_records(records: Iterable[Any]) -> list[MemoryObservation]:
    """The memory facts of a study's finished trials (`study.record.TrialRecord`s): measured peaks
    (ok, over the limit, diverged) and over-limit outcomes without one (oom, the CPU watchdog).
    Not: a trial that did not get as far as memory (unsupported, crashed, timed out, interrupted,
    killed from outside), a prediction (no fact: it must not feed the next one), or a re-proposed
    configuration (it copies its original's figures)."""
    found = []
    for r in records:
        if r.config is None or r.outcome is None or r.duplicate_of is not None:
            continue
        over = r.outcome in outcomes.INFEASIBLE
        if over or (r.peak_memory_bytes is not None and r.outcome in outcomes.MEASURED_MEMORY):
            peak = r.peak_memory_bytes if r.outcome in outcomes.MEASURED_MEMORY else None
            found.append(MemoryObservation(dict(r.config), peak, over, r.number))
    return found


def skip_prediction(
    records: Iterable[Any], params: Mapping[str, Any], feasible_limit: int, context: MemoryContext
) -> MemoryPrediction | None:
    """The prediction on which a study skips `params` without running it (sure over the limit
    less the headroom), or None when it runs. What the objective asks before every sampled
    trial, and what the sweep replay (benchmarks/time_to_recipe.py) asks in its place. Before
    any memory was measured the prior alone never skips: the trial runs, and teaches the model."""
    observations = observations_from_records(records)
    if not observations:
        return None  # no basis but the prior: it runs, and teaches the model
    prediction = MemoryModel(context, feasible_limit).fit(observations).predict(params)
    return prediction if prediction.sure_over else None


def memory_context(ctx: Any) -> MemoryContext:
    """The memory model's context for a study (`search.training.TrainTask`)."""
    return MemoryContext.of(
        ctx.device.kind, model=ctx.spec.model, n_layer=ctx.space.n_layer, seq_len=ctx.space.seq_len, dims=ctx.model_dims
    )


def _normal_cdf(z: float) -> float:
    return 0.5 * math.erfc(-z / math.sqrt(2))


def erfc(x: np.ndarray) -> np.ndarray:
    """erfc of an array: scipy's where installed, else math.erfc element by element."""
    try:
        from scipy.special import erfc
    except ImportError:
        return np.vectorize(math.erfc, otypes=[float])(x)
    return erfc(x)
