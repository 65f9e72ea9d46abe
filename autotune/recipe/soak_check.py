"""`autotune verify --soak`: run a recipe for one full epoch of the data's batches (every batch
shape at least once) or N steps, in a fresh process (`measure.soak_loop`), and judge whether its
memory creeps toward the limit: the check to run before committing a week of GPU time.

The creep rule. The memory a run may use is the limit less the recipe's headroom (the target).
The soak fails when
  - any window's peak is above the target already; or
  - memory still grows in the second half: the least-squares slope of the windows' peaks
    against steps, over the second half of the windows (at least 3), projects the last fitted
    peak past the target within CREEP_HORIZON times the run's length.
The first half is left out of the fit: the caching allocator and the DataLoader's workers fill
up early in a run, by design, and settle; a leak (tensors kept across steps, a growing cache,
fragmentation that keeps reserving) keeps growing after that, and a straight line is the
simplest faithful extrapolation of steady growth. CREEP_HORIZON = 10: a soak of an epoch stands
for a run of several epochs; memory that would reach the target within ten soaks' worth of steps
would reach it in the run it vouches for. A growth too slow to reach it within that is reported
(slope, projection) and passes."""

from __future__ import annotations

from typing import Any

from autotune.config import MAX_STEPS, check_int
from autotune.device import describe
from autotune.measure import outcomes
from autotune.measure.outcomes import DEFAULT_MEMORY_HEADROOM
from autotune.recipe.recipe import Recipe
from autotune.recipe.verify import recipe_run_spec
from autotune.trial.runner import run_soak
from autotune.units import format_bytes

CREEP_HORIZON = 10  # a creep that would cross the target within this many run lengths fails
MIN_FIT_WINDOWS = 3  # fewer windows in the second half: no slope is fitted


def soak_recipe(
    recipe: Recipe,
    *,
    device: str,
    steps: int | None,
    warmup: int,
    data: str | None = None,
    timeout_s: float,
    model: str | None = None,
    allow_model_import: bool = False,
) -> dict[str, Any]:
    """Run the recipe's configuration here for `steps` steps (None: one epoch) and judge it."""
    if steps is not None:
        check_int("steps", steps, minimum=2, maximum=MAX_STEPS)
    spec = recipe_run_spec(
        recipe,
        device=device,
        data=data,
        warmup=warmup,
        steps=2,  # the soak sets its own length; RunSpec's timed window is not used
        min_time_s=0.0,
        timeout_s=timeout_s,
        model=model,
        allow_model_import=allow_model_import,
    )
    outcome, reason, run = run_soak(spec, recipe.config, steps=steps, timeout_s=timeout_s, device=describe(device))
    headroom = recipe.measured.get("memory_headroom")
    headroom = DEFAULT_MEMORY_HEADROOM if headroom is None else headroom
    return judge_soak(run, outcome, reason, limit=spec.memory_limit_bytes, headroom=headroom)


def judge_soak(
    run: dict[str, Any] | None, outcome: str, reason: str | None, *, limit: int | None, headroom: float
) -> dict[str, Any]:
    """The soak's report: its windows, the memory's maximum, growth and fitted creep, and the
    verdict (see the module's docstring)."""
    windows = (run or {}).get("windows") or []
    peaks = [(w["end_step"], w["peak_memory_bytes"]) for w in windows if w["peak_memory_bytes"] is not None]
    target = outcomes.feasible_peak_bytes(limit, headroom) if limit is not None else None
    slope, fitted_last = creep(peaks)
    steps = (run or {}).get("steps") or 0
    projected = fitted_last + slope * CREEP_HORIZON * steps if slope is not None else None
    failures = []
    if outcome != outcomes.OK:
        failures.append(f"the run ended {outcome}" + (f": {reason.splitlines()[0]}" if reason else ""))
    top = max((p for _, p in peaks), default=None)
    if target is not None and top is not None and top > target:
        failures.append(f"peak memory {format_bytes(top)} is above the limit less its headroom {format_bytes(target)}")
    elif target is not None and projected is not None and slope > 0 and projected >= target:
        failures.append(
            f"memory grows {format_bytes(int(slope * 1000))} per 1000 steps in the second half: it would pass "
            f"{format_bytes(target)} within {CREEP_HORIZON}x this run ({CREEP_HORIZON * steps} steps)"
        )
    return {
        **(run or {}),
        "outcome": outcome,
        "max_memory_bytes": top,
        "memory_growth_bytes": peaks[-1][1] - peaks[0][1] if len(peaks) >= 2 else None,
        "slope_bytes_per_step": slope,
        "projected_memory_bytes": int(projected) if projected is not None else None,
        "creep_horizon_steps": CREEP_HORIZON * steps,
        "memory_limit_bytes": limit,
        "memory_headroom": headroom,
        "memory_target_bytes": target,
        "passed": not failures,
        "reason": "; ".join(failures) or None,
    }


def creep(peaks: list[tuple[int, int]]) -> tuple[float | None, float]:
    """(least-squares slope in bytes per step, fitted value at the last window) over the second
    half of the (step, peak) windows; (None, last peak) when fewer than MIN_FIT_WINDOWS remain."""
    half = peaks[len(peaks) // 2 :]
    if len(half) < MIN_FIT_WINDOWS:
        return None, float(peaks[-1][1]) if peaks else 0.0
    xs, ys = [float(x) for x, _ in half], [float(y) for _, y in half]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return slope, my + slope * (xs[-1] - mx)
