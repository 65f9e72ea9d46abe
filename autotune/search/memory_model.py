"""Peak memory of a configuration, predicted from the trials a study has already run, so that a
configuration sure to break the memory limit is not run to find out (DeepSpeed's autotuner
skips such configurations with a memory estimate; Lightning and HF users find the limit by
probing for OOM).

What is predicted, and from what:

- A *family* is a set of configurations whose knobs are all equal except the token budget
  (the one budget-like knob of TrainConfig: the global batch is the study's, the same for every
  trial). Within a family, memory is `fixed + per_token x budget`: weights, gradients and
  optimizer state do not depend on the budget, activations and logits are linear in it
  (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
  eq. 1-2: s*b*h*(34 + 5*a*s/h) bytes per layer, linear in the tokens s*b).
- Two or more measured peaks at different budgets: a least-squares line, its slope held at
  or above zero, extrapolated to the proposed budget.
- Memory never falls as the budget grows, all else equal: a family member that went over
  the limit (out of memory, or measured above it) at a budget no larger than the proposed one
  makes the proposal over the limit too, whatever the fit says. A single measured peak below
  the limit only bounds the proposal from below, which says nothing about the limit.
- No family member, or only smaller budgets under the limit with one point: no basis, `None`,
  and the trial runs.

A prediction *from a fit* counts as over the limit only beyond a clear margin
(`CLEAR_MARGIN`, 10 %): a line through two points of the recorded CPU sweep
(benchmarks/data/cpu_gpt2_tiny_sweep.json), extrapolated to each larger budget of its family,
over-predicted the measured peak by at most 9.8 % in 48 cases (median error 0.4 %). Skipping
a configuration that would have fit costs the search its answer; running one that does not
fit costs one trial, so the margin leans towards running. A bound from an over-limit trial is
certain and needs no margin.

Pure and torch-free: the study's objective calls it, and so does the sweep replay
(benchmarks/), with the same observations."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from optuna.trial import FrozenTrial, TrialState

from autotune import registry
from autotune.measure import outcomes
from autotune.units import format_bytes

# The knob a family varies. TrainConfig has one budget-like knob: the global batch
# (RunSpec.global_batch_tokens) is fixed per study, reached by accumulating micro-batches of
# `token_budget`, and accumulation does not change the peak of one micro-batch.
BUDGET_KNOBS = ("token_budget",)
CLEAR_MARGIN = 0.10  # see the module docstring: the largest over-prediction of the CPU sweep was 9.8 %
# Knobs that move host memory only. On a GPU the limit is the device's memory, which DataLoader
# workers and pinned host buffers do not touch, so configurations that differ only in these knobs
# share a family there. On a CPU the limit is the process tree's resident memory, workers
# included: there they define the family like any other knob.
HOST_ONLY_KNOBS = tuple(k.name for k in registry.knobs_of(registry.TRAIN) if k.host_only)


@dataclass(frozen=True)
class MemoryObservation:
    """What one finished trial says about memory. `params`: its knob values (TrainConfig.to_dict()).
    `peak_bytes`: its measured peak, None when it never measured one (out of memory, or stopped
    by the CPU watchdog). `over_limit`: it broke the study's limit, so every configuration of its
    family with a budget at least as large breaks it too."""

    params: Mapping[str, Any]
    peak_bytes: int | None
    over_limit: bool
    trial: int | None = None  # its number in the study, so that a basis can name it


@dataclass(frozen=True)
class MemoryPrediction:
    """A predicted peak and where it comes from. `peak_bytes` is the fit's estimate, or, for a
    bound from an over-limit trial (`lower_bound`), the least the peak can be. `basis` is one line
    for people: which trials, what fit."""

    peak_bytes: int
    basis: str
    over_limit_by_clear_margin: bool
    lower_bound: bool = False
    from_oom: bool = False  # a bound from a trial that ran out of memory: how far over is unknown
    trials: tuple[int, ...] = ()  # the trials it rests on, where the observations carry numbers

    def constraint(self, limit_bytes: int, headroom: float = 0.0) -> float:
        """The memory constraint to record for this prediction, as the objective records a
        measured one (outcomes.memory_constraint: against the limit less the headroom, as a
        fraction of the limit; feasible at or below 0). A bound from an out-of-memory trial
        inherits that trial's constraint (how far over is unknown)."""
        excess = outcomes.memory_constraint(self.peak_bytes, limit_bytes, headroom)
        return max(excess, outcomes.UNKNOWN_EXCESS) if self.from_oom else excess


def observations_from_trials(trials: Iterable[FrozenTrial]) -> list[MemoryObservation]:
    """The memory facts of a study's finished trials, as the objective records them: the
    configuration in user attr `config`, the outcome in `outcome`, a measured peak in
    `peak_memory_bytes`. A trial that did not get as far as memory (unsupported, crashed, timed
    out, interrupted), a configuration skipped on a prediction (a prediction is no fact: it
    must not feed the next one), and a re-proposed configuration (it copies its original's
    figures) say nothing new and are left out."""
    found: list[MemoryObservation] = []
    for t in trials:
        attrs = t.user_attrs
        config, outcome = attrs.get("config"), attrs.get("outcome")
        if config is None or outcome is None or "duplicate_of" in attrs:
            continue
        peak = attrs.get("peak_memory_bytes")
        over = outcome in outcomes.INFEASIBLE
        if over or (peak is not None and outcome in outcomes.MEASURED_MEMORY):
            found.append(MemoryObservation(dict(config), peak if isinstance(peak, int) else None, over, t.number))
    return found


def skip_prediction(
    trials: Iterable[FrozenTrial], params: Mapping[str, Any], limit_bytes: int, *, device_kind: str
) -> MemoryPrediction | None:
    """The prediction on which a study skips configuration `params` (knob values), or None when
    it runs: what the objective asks before every sampled trial, and what the sweep replay
    (benchmarks/time_to_recipe.py) asks in its place. `trials`: the study's trials (those not
    finished say nothing). Host-only knobs share a family on a GPU (HOST_ONLY_KNOBS)."""
    done = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    ignore = HOST_ONLY_KNOBS if device_kind == "cuda" else ()
    prediction = predict_peak(observations_from_trials(done), params, limit_bytes, ignore=ignore)
    return prediction if prediction is not None and prediction.over_limit_by_clear_margin else None


def family_key(params: Mapping[str, Any], ignore: Iterable[str] = ()) -> tuple:
    """What a family shares: every knob but the budget (and `ignore`d ones)."""
    skip = set(BUDGET_KNOBS) | set(ignore)
    return tuple(sorted((k, _hashable(v)) for k, v in params.items() if k not in skip))


def predict_peak(
    observations: Sequence[MemoryObservation],
    params: Mapping[str, Any],
    limit_bytes: int,
    *,
    ignore: Iterable[str] = (),
) -> MemoryPrediction | None:
    """The predicted peak of configuration `params` (knob values), or None without a basis.
    `ignore`: knobs that do not move the memory the limit applies to (HOST_ONLY_KNOBS on a GPU)."""
    ignore = tuple(ignore)
    budget = int(params["token_budget"])
    key = family_key(params, ignore)
    family = [o for o in observations if family_key(o.params, ignore) == key]
    if not family:
        return None
    bound = _over_limit_bound(family, budget, limit_bytes)
    fit = _linear_fit(family, budget)
    if bound is not None:
        peak, basis, from_oom, numbers = bound
        if fit is not None and fit[0] > peak:  # the fit says more than the bound: both are the basis
            return MemoryPrediction(fit[0], f"{basis}; {fit[1]}", True, trials=tuple(dict.fromkeys(numbers + fit[2])))
        return MemoryPrediction(peak, basis, True, lower_bound=True, from_oom=from_oom, trials=numbers)
    if fit is None:
        return None
    peak, basis, numbers = fit
    # Never below a peak measured at a budget no larger than this one (the monotonic rule).
    floor = max((o.peak_bytes for o in family if o.peak_bytes is not None and _budget(o) <= budget), default=0)
    peak = max(peak, floor)
    return MemoryPrediction(peak, basis, peak >= (1 + CLEAR_MARGIN) * limit_bytes, trials=numbers)


def _over_limit_bound(
    family: Sequence[MemoryObservation], budget: int, limit_bytes: int
) -> tuple[int, str, bool, tuple[int, ...]] | None:
    """(least peak, basis, from an OOM, trials) when a family member at a budget <= `budget` broke the limit."""
    over = [o for o in family if o.over_limit and _budget(o) <= budget]
    if not over:
        return None
    # The member with the largest budget bounds tightest; its measured peak if it has one
    # (over the limit by definition), else just above the limit.
    o = max(over, key=lambda o: (_budget(o), o.peak_bytes or 0))
    peak = max(o.peak_bytes or 0, limit_bytes + 1)
    what = f"measured peak {format_bytes(o.peak_bytes)}" if o.peak_bytes is not None else "out of memory"
    basis = (
        f"{_name(o)} at token_budget {_budget(o)} went over the limit ({what}); with all other knobs equal, "
        f"memory does not fall as the budget grows to {budget}"
    )
    return peak, basis, o.peak_bytes is None, _numbers([o])


def _linear_fit(family: Sequence[MemoryObservation], budget: int) -> tuple[int, str, tuple[int, ...]] | None:
    """(peak at `budget`, basis, trials) from a least-squares line through the family's
    measured peaks; None with fewer than two distinct budgets."""
    points = [(_budget(o), o.peak_bytes, o) for o in family if o.peak_bytes is not None]
    if len({b for b, _, _ in points}) < 2:
        return None
    n = len(points)
    mean_b = sum(b for b, _, _ in points) / n
    mean_m = sum(m for _, m, _ in points) / n
    slope = sum((b - mean_b) * (m - mean_m) for b, m, _ in points) / sum((b - mean_b) ** 2 for b, _, _ in points)
    slope = max(0.0, slope)  # memory does not fall with the budget: a negative slope is noise
    fixed = mean_m - slope * mean_b
    peak = int(round(fixed + slope * budget))
    names = ", ".join(f"{_name(o)} ({b}: {format_bytes(m)})" for b, m, o in sorted(points, key=lambda p: p[0]))
    basis = (
        f"linear fit of peak vs token_budget over {names}: {format_bytes(int(fixed))} + "
        f"{format_bytes(int(round(slope)))}/token -> {format_bytes(peak)} at {budget}"
    )
    return peak, basis, _numbers([o for _, _, o in points])


def _budget(o: MemoryObservation) -> int:
    return int(o.params["token_budget"])


def _name(o: MemoryObservation) -> str:
    return f"#{o.trial}" if o.trial is not None else "a trial"


def _numbers(obs: Iterable[MemoryObservation]) -> tuple[int, ...]:
    return tuple(o.trial for o in obs if o.trial is not None)


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value
