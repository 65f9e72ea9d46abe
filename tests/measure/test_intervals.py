"""The 95 % interval of a throughput from its step times (`measure.intervals`): exact ranks,
coverage on skewed and on autocorrelated step times, shapes and accumulation."""

from __future__ import annotations

import math
import random

import pytest

from autotune.measure import intervals


def skewed_ar1_times(seed: int, n: int, rho: float) -> list[float]:
    """Log-normal step times (median 1 s, a long right tail) whose logs are AR(1) with lag-1
    correlation rho: a hot or throttled stretch lasts several steps."""
    rng, x, times = random.Random(seed), 0.0, []
    for _ in range(n):
        x = rho * x + math.sqrt(1 - rho * rho) * rng.gauss(0.0, 1.0)
        times.append(math.exp(0.3 * x))
    return times


def coverage(rho: float, n: int = 60, runs: int = 300) -> float:
    """How often the interval of the rate covers the true rate (1 unit of work per second at the
    median step time of 1 s), over runs whose interval is known."""
    hits = known = 0
    for seed in range(runs):
        times = skewed_ar1_times(seed, n, rho)
        rate = 1.0 / sorted(times)[n // 2]
        interval = intervals.rate_interval(rate, times, [1.0] * n)
        if interval is not None:
            known += 1
            hits += interval[0] <= 1.0 <= interval[1]
    return hits / known


def test_the_ranks_are_the_distribution_free_ones():
    """n = 20: [x_(6), x_(15)] (the textbook pair); n = 6 is the fewest with a 95 % pair."""
    low, high = intervals.median_rank_levels(20)
    assert (round(low * 20 + 0.5), round(high * 20 + 0.5)) == (6, 15)
    assert intervals.median_rank_levels(6) == pytest.approx((0.5 / 6, 5.5 / 6))
    assert intervals.median_rank_levels(5.9) is None


def test_skewed_independent_step_times_are_covered_95_percent_of_the_time():
    assert coverage(rho=0.0) >= 0.93


def test_autocorrelated_step_times_are_still_covered(monkeypatch):
    """With a lag-1 correlation of 0.6, ranks taken as if the steps were independent cover the
    truth far less than 95 % of the time; the effective sample size restores it."""
    assert coverage(rho=0.6) >= 0.92
    monkeypatch.setattr(intervals, "effective_sample_size", lambda values: float(len(values)))
    assert coverage(rho=0.6) < 0.85


def test_shapes_that_differ_by_design_are_not_noise():
    """Two batch shapes, each step's time exactly proportional to its FLOPs: no noise, so the
    interval is the point; the raw step times alone would spread by 3x."""
    work = [1.0, 3.0] * 10
    interval = intervals.rate_interval(1000.0, [0.01 * w for w in work], work)
    assert interval == pytest.approx((1000.0, 1000.0))


def test_under_accumulation_an_optimizer_step_is_the_unit():
    """Every 2nd micro-step also runs the optimizer (3x longer): grouped into optimizer steps,
    the times are alike and the interval is the point; taken one by one, they would spread."""
    times = [0.01, 0.03] * 16
    work = [1.0] * 32
    assert intervals.per_unit_times(times, work, accumulation=2) == pytest.approx([0.02] * 16)
    assert intervals.rate_interval(500.0, times, work, accumulation=2) == pytest.approx((500.0, 500.0))
    low, high = intervals.rate_interval(500.0, times, work, accumulation=1)
    assert high / low > 2


def test_too_few_steps_give_no_interval_and_unknown_overlaps_everything():
    assert intervals.rate_interval(100.0, [0.1] * 5, [1.0] * 5) is None
    assert intervals.overlap(None, [1.0, 2.0]) and intervals.overlap([1.0, 2.0], [1.5, 3.0])
    assert not intervals.overlap([1.0, 2.0], [2.5, 3.0])
