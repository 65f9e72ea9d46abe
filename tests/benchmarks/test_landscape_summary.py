"""benchmarks/landscape_summary.py: saved landscape_table runs side by side, and the tuner's cells
counted against issue A's targets (a cell meets a target or it does not; n.r. meets none of the
trial and seconds targets)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

from tests.helpers import ROOT


def stats(median: float) -> dict:
    return {"median": median, "q1": median, "q3": median}


def strategy(trials: float, seconds: float, *, within: int, runs: int = 10, over_run: float = 0, over_rec: int = 0):
    return {
        "runs": runs,
        "reached": runs if not math.isinf(trials) else 0,
        "trials_to_3pct": stats(trials),
        "seconds_to_3pct": stats(seconds),
        "recommends_within_3pct": within,
        "recommends_over_limit": over_rec,
        "over_limit_run": stats(over_run),
        "trials_total": stats(15),
    }


def cell(landscape: str, q: float, **strategies) -> dict:
    return {
        "landscape": landscape,
        "quantile": q,
        "configurations": 1000,
        "within_3pct": 4,
        "random_exact": {"trials_to_3pct": stats(500), "seconds_to_3pct": stats(1000.0)},
        "strategies": strategies,
    }


def test_the_tuner_is_counted_against_each_target_and_strategies_of_several_files_meet(tmp_path):
    tuner_file = tmp_path / "tuner.json"
    tuner_file.write_text(
        json.dumps(
            [
                cell("a", 0.5, tuner=strategy(4, 100.0, within=10)),  # meets every target
                cell("b", 0.5, tuner=strategy(20, 300.0, within=8, over_run=3)),  # 0.30x, 8/10, 3 over
                cell("c", 0.5, tuner=strategy(math.inf, math.inf, within=2, over_rec=1)),
            ]
        )
    )
    tpe_file = tmp_path / "tpe.json"
    tpe_file.write_text(json.dumps([cell("a", 0.5, tpe=strategy(90, 700.0, within=0, runs=5))]))
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "landscape_summary.py"), str(tuner_file), str(tpe_file)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    row_a = next(line for line in out.splitlines() if line.startswith("| a | 0.5 |"))
    assert "| 4 | 0.100 | 10/10 | 10/10 |" in row_a and "| 90 | 0.700 | 5/5 |" in row_a  # both files' strategies
    assert "| median trials to 3 % <= 12 | 1/3 |" in out
    assert "| median seconds <= 0.25x random search's | 1/3 |" in out
    assert "| stops within 3 % in >= 90 % of seeds | 1/3 |" in out
    assert "| 0 recommendations over the limit | 2/3 |" in out
    assert "| median over-limit configurations run <= 2 | 2/3 |" in out
    assert "within 3 % in 20/30 runs, over the limit in 1/30." in out
