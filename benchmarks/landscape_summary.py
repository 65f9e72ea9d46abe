"""landscape_table.py's saved runs side by side: one row per landscape and memory quantile, a
column group per strategy, and the tuner against the issue's targets.

    python benchmarks/landscape_summary.py benchmarks/results/2026-12-02/*.json

Each JSON is what `landscape_table.py --json` wrote (any strategies, any seeds: each cell says how
many seeds it rests on). Cells are medians over the seeds, "n.r." where the median seed did not come
within 3 % of the best feasible configuration in the run's trial cap; "s vs random" divides by the
exact median seconds of random search (`_replay.random_search_exactly`)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import _common  # noqa: F401  (puts the checkout on sys.path)
from _common import md_table

# The targets of issue A (#25), each as (label, test on one tuner cell).
TARGETS = (
    ("median trials to 3 % <= 12", lambda s, r: s["trials_to_3pct"]["median"] <= 12),
    ("median seconds <= 0.25x random search's", lambda s, r: _ratio(s, r) <= 0.25),
    ("stops within 3 % in >= 90 % of seeds", lambda s, r: s["recommends_within_3pct"] >= 0.9 * s["runs"]),
    ("0 recommendations over the limit", lambda s, r: s["recommends_over_limit"] == 0),
    ("median over-limit configurations run <= 2", lambda s, r: s["over_limit_run"]["median"] <= 2),
)


def _ratio(s: dict, random_exact: dict) -> float:
    seconds, random_s = s["seconds_to_3pct"]["median"], random_exact["seconds_to_3pct"]["median"]
    return math.inf if math.isinf(seconds) or math.isinf(random_s) else seconds / random_s


def _trials(s: dict) -> str:
    median = s["trials_to_3pct"]["median"]
    return "n.r." if math.isinf(median) else f"{median:g}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", help="JSON files written by landscape_table.py --json")
    args = p.parse_args()
    cells: dict[tuple[str, float], dict] = {}
    for path in args.runs:
        for result in json.loads(Path(path).read_text()):
            key = (result["landscape"], result["quantile"])
            entry = cells.setdefault(key, {"strategies": {}, "random_exact": result["random_exact"], "meta": result})
            entry["strategies"].update(result["strategies"])
    strategies = sorted({name for c in cells.values() for name in c["strategies"]}, key=_order)
    headers = ["landscape", "q", "configs (within 3 %)"]
    for name in strategies:
        headers += [f"{name}: trials to 3 %", f"{name}: s vs random", f"{name}: reached"]
        if name == "tuner":
            headers += ["tuner: stops within 3 %", "tuner: trials to stop", "tuner: over-limit run"]
    headers += ["random (exact): trials to 3 %"]
    rows = []
    for (landscape, q), entry in sorted(cells.items()):
        meta = entry["meta"]
        row = [landscape, f"{q:g}", f"{meta['configurations']} ({meta['within_3pct']})"]
        for name in strategies:
            s = entry["strategies"].get(name)
            if s is None:
                row += ["-", "-", "-"] + (["-", "-", "-"] if name == "tuner" else [])
                continue
            ratio = _ratio(s, entry["random_exact"])
            row += [_trials(s), "-" if math.isinf(ratio) else f"{ratio:.3f}", f"{s['reached']}/{s['runs']}"]
            if name == "tuner":
                row += [
                    f"{s['recommends_within_3pct']}/{s['runs']}",
                    f"{s['trials_total']['median']:g}",
                    f"{s['over_limit_run']['median']:g}",
                ]
        row.append(f"{entry['random_exact']['trials_to_3pct']['median']:.0f}")
        rows.append(row)
    print(md_table(headers, rows))
    tuner = [(e["strategies"]["tuner"], e["random_exact"]) for e in cells.values() if "tuner" in e["strategies"]]
    if tuner:
        print()
        print(f"The tuner against the targets, over {len(tuner)} landscape x quantile cells:")
        print()
        print(
            md_table(
                ["target", "cells met"],
                [[label, f"{sum(test(s, r) for s, r in tuner)}/{len(tuner)}"] for label, test in TARGETS],
            )
        )
        runs = sum(s["runs"] for s, _ in tuner)
        within = sum(s["recommends_within_3pct"] for s, _ in tuner)
        over = sum(s["recommends_over_limit"] for s, _ in tuner)
        print()
        print(
            f"Over every seed: the recommendation is within 3 % in {within}/{runs} runs, "
            f"over the limit in {over}/{runs}."
        )
    return 0


def _order(name: str) -> tuple[int, str]:
    return ({"tuner": 0, "gp": 1, "tpe": 2, "random": 3}.get(name, 4), name)


if __name__ == "__main__":
    sys.exit(main())
