"""The soak's verdict (issue 16, item 3), on constructed windows: memory above the limit less
the headroom fails; memory still growing in the second half fails when its least-squares line
would reach that within 10x the run; growth that settles in the first half (the allocator and
the workers filling up) passes."""

from __future__ import annotations

import pytest

from autotune.recipe.soak_check import CREEP_HORIZON, creep, judge_soak

MiB = 1 << 20
LIMIT = 1000 * MiB  # target: 950 MiB at 5 %


def run(peaks: list[int], steps: int = 100) -> dict:
    n = len(peaks)
    windows = [
        {
            "end_step": steps * (k + 1) // n,
            "steps": steps // n,
            "seconds": 1.0,
            "tokens_per_sec": 1e4,
            "peak_memory_bytes": p,
        }
        for k, p in enumerate(peaks)
    ]
    return {"steps": steps, "windows": windows}


def judged(peaks: list[int], *, limit: int | None = LIMIT, outcome: str = "ok", steps: int = 100) -> dict:
    return judge_soak(run(peaks, steps), outcome, None, limit=limit, headroom=0.05)


def test_flat_memory_passes():
    result = judged([500 * MiB] * 10)
    assert result["passed"] and result["reason"] is None
    assert result["slope_bytes_per_step"] == 0 and result["memory_growth_bytes"] == 0
    assert result["max_memory_bytes"] == 500 * MiB and result["memory_target_bytes"] == int(LIMIT * 0.95)


def test_growth_that_settles_in_the_first_half_passes():
    result = judged([300 * MiB, 400 * MiB, 450 * MiB, 500 * MiB, 500 * MiB] + [500 * MiB] * 5)
    assert result["passed"], result["reason"]
    assert result["memory_growth_bytes"] == 200 * MiB and result["slope_bytes_per_step"] == 0


def test_a_steady_creep_that_would_reach_the_target_within_ten_runs_fails():
    # +6 MiB a window of 10 steps in the second half: 0.6 MiB a step; 530 + 0.6 x 1000 > 950
    peaks = [500 * MiB] * 5 + [(500 + 6 * k) * MiB for k in range(1, 6)]
    result = judged(peaks)
    assert not result["passed"]
    assert result["slope_bytes_per_step"] == pytest.approx(0.6 * MiB)
    assert result["projected_memory_bytes"] == pytest.approx((530 + 0.6 * CREEP_HORIZON * 100) * MiB, rel=1e-6)
    assert result["reason"] == (
        "memory grows 600.00 MiB per 1000 steps in the second half: it would pass 950.00 MiB within 10x this run "
        "(1000 steps)"
    )


def test_a_creep_too_slow_to_reach_the_target_passes_and_is_reported():
    peaks = [500 * MiB] * 5 + [500 * MiB + k * 100_000 for k in range(1, 6)]  # 10 kB a step: +10 MB in 1000
    result = judged(peaks)
    assert result["passed"] and result["slope_bytes_per_step"] == pytest.approx(10_000)


def test_a_peak_above_the_limit_less_the_headroom_fails():
    result = judged([500 * MiB] * 9 + [960 * MiB])
    assert not result["passed"]
    assert result["reason"] == "peak memory 960.00 MiB is above the limit less its headroom 950.00 MiB"


def test_without_a_limit_growth_is_reported_not_judged():
    result = judged([500 * MiB] * 5 + [(500 + 100 * k) * MiB for k in range(1, 6)], limit=None)
    assert result["passed"] and result["memory_growth_bytes"] == 500 * MiB


def test_a_run_that_did_not_finish_fails_with_its_outcome():
    result = judge_soak(None, "oom", "out of memory: CUDA out of memory", limit=LIMIT, headroom=0.05)
    assert not result["passed"] and result["reason"] == "the run ended oom: out of memory: CUDA out of memory"


def test_too_few_windows_fit_no_slope():
    assert creep([(1, 10), (2, 20), (3, 30), (4, 40)]) == (None, 40.0)  # 2 in the second half
    slope, last = creep([(1, 10), (2, 20), (3, 30), (4, 40), (5, 50), (6, 60)])
    assert slope == pytest.approx(10) and last == pytest.approx(60)
