"""95 % intervals for a throughput, from the step times of its timed window. Pure Python, no torch.

The method, and why:
- The unit is one optimizer step (its micro-steps together, under accumulation): the rate is
  made of whole optimizer steps, and a step that also runs the optimizer is longer by design.
- Each unit's time is divided by its modelled work (FLOPs, pads included, as the loop's CV
  does): length-grouped batches differ in shape, so raw step times vary by design; time per
  FLOP leaves the noise.
- Step times are skewed (a long tail of stalls: data waits, GC, clock changes), so no normal
  interval on the mean: a distribution-free interval for the MEDIAN time per FLOP, from order
  statistics (the ranks a Binomial(n, 1/2) puts around the middle; David & Nagaraja, "Order
  Statistics", 3rd ed., section 7.1). It assumes nothing about the distribution's shape.
- Step times are autocorrelated (a hot or throttled stretch lasts several steps), which makes
  n steps worth fewer independent ones: the ranks are taken for the effective sample size of an
  AR(1) series, n (1 - rho) / (1 + rho), rho the lag-1 autocorrelation (clipped at 0: negative
  correlation is not allowed to narrow the interval). This widens the interval by about
  sqrt(n / n_eff), as the variance of a mean of AR(1) draws is.
- The median's interval is mapped onto the rate by ratio: the window's rate (tokens / wall
  time) times median / bound. The rate and the median share their noise; the ratio carries the
  relative uncertainty over without assuming the rate's skew.
It covers the noise within one run. Two runs in two processes differ more (clocks, memory
layout): that is what re-measuring the leaders in fresh processes is for (`search.confirm`).
"""

from __future__ import annotations

import math
import statistics
from typing import Sequence

CONFIDENCE = 0.95
# Below this many effective samples no pair of order statistics covers the median with 95 %
# (2 * 0.5**6 = 0.031 < 0.05 is the first n that does): the interval is then unknown (None).
MIN_EFFECTIVE_SAMPLES = 6


def effective_sample_size(values: Sequence[float]) -> float:
    """n (1 - rho) / (1 + rho) for lag-1 autocorrelation rho >= 0 (n for fewer than 3 values)."""
    n = len(values)
    if n < 3:
        return float(n)
    mean = statistics.fmean(values)
    deviations = [v - mean for v in values]
    variance = sum(d * d for d in deviations)
    if variance <= 0:
        return float(n)
    rho = sum(a * b for a, b in zip(deviations, deviations[1:])) / variance
    rho = min(max(rho, 0.0), 0.99)
    return n * (1 - rho) / (1 + rho)


def median_rank_levels(n_eff: float, confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """The quantile levels (lower, upper) whose order statistics bracket the median with at
    least `confidence`, for `n_eff` independent samples; None when too few. With m = floor(n_eff)
    samples, the interval [x_(k), x_(m+1-k)] misses the median with probability
    2 P(Binomial(m, 1/2) < k); k is the largest that keeps this within 1 - confidence."""
    m = int(math.floor(n_eff))
    if m < MIN_EFFECTIVE_SAMPLES:
        return None
    alpha = 1.0 - confidence
    k, below = 0, 0.0  # below: P(Binomial(m, 1/2) < k + 1), built up term by term
    while True:
        below += math.comb(m, k) / 2.0**m
        if 2 * below > alpha:
            break
        k += 1
    # k is now the largest rank (1-based) with 2 P(B < k) <= alpha; k >= 1 since m >= 6
    return (k - 0.5) / m, (m - k + 0.5) / m


def quantile(sorted_values: Sequence[float], level: float) -> float:
    """The empirical quantile at `level` (0..1) by linear interpolation between order statistics."""
    position = level * len(sorted_values) - 0.5
    low = min(max(int(math.floor(position)), 0), len(sorted_values) - 1)
    high = min(low + 1, len(sorted_values) - 1)
    fraction = min(max(position - low, 0.0), 1.0)
    return sorted_values[low] + fraction * (sorted_values[high] - sorted_values[low])


def per_unit_times(step_times: Sequence[float], work_per_step: Sequence[float], accumulation: int = 1) -> list[float]:
    """Time per unit of work of each optimizer step (groups of `accumulation` micro-steps)."""
    size = max(1, accumulation)
    units = []
    for start in range(0, len(step_times) - size + 1, size):
        time_s = sum(step_times[start : start + size])
        work = sum(work_per_step[start : start + size])
        if work > 0:
            units.append(time_s / work)
    return units


def rate_interval(
    rate: float,
    step_times: Sequence[float],
    work_per_step: Sequence[float],
    accumulation: int = 1,
    confidence: float = CONFIDENCE,
) -> tuple[float, float] | None:
    """A `confidence` interval (low, high) for a throughput measured over these steps (see the
    module's docstring); None when the window has too few effective samples."""
    units = per_unit_times(step_times, work_per_step, accumulation)
    levels = median_rank_levels(effective_sample_size(units), confidence) if units else None
    if levels is None or rate <= 0:
        return None
    ordered = sorted(units)
    median = statistics.median(ordered)
    slow, fast = quantile(ordered, levels[1]), quantile(ordered, levels[0])  # a long time is a low rate
    if median <= 0 or fast <= 0:
        return None
    return rate * median / slow, rate * median / fast


def time_per_flop_cv(step_times: Sequence[float], work_per_step: Sequence[float], accumulation: int = 1) -> float:
    """Coefficient of variation of the time per modelled FLOP of each step (the measuring
    loop's step-time spread, `measure.loop._Window.cv` says why per FLOP). Under accumulation,
    the micro-steps that end an optimizer step also run the optimizer, longer by design: they
    are left out when at least two others remain."""
    pairs = list(zip(step_times, work_per_step))
    if accumulation > 1:
        inner = [p for i, p in enumerate(pairs) if (i + 1) % accumulation]
        pairs = inner if len(inner) >= 2 else pairs
    if len(pairs) < 2:
        return 0.0
    per_flop = [t / w for t, w in pairs]
    mean = statistics.fmean(per_flop)
    return statistics.stdev(per_flop) / mean if mean > 0 else 0.0


def scaled(interval: Sequence[float] | None, factor: float) -> list[float] | None:
    """The same relative interval around another figure of the same window (padded tokens/s)."""
    return None if interval is None else [interval[0] * factor, interval[1] * factor]


def overlap(a: Sequence[float] | None, b: Sequence[float] | None) -> bool:
    """Whether two intervals overlap; an unknown interval overlaps everything (it cannot tell
    the two apart)."""
    if a is None or b is None:
        return True
    return a[0] <= b[1] and b[0] <= a[1]
