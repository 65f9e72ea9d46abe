"""benchmarks/sample_efficiency.py and _common.py: the sampler's replay on the recorded sweep
(benchmarks/data/cpu_gpt2_tiny_sweep.json), and the sweep's enumeration of a space."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import ROOT


@pytest.mark.process
def test_sample_efficiency_replay():
    proc = subprocess.run(
        [sys.executable, "benchmarks/sample_efficiency.py", "--json", "--seeds", "3"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    n = out["configurations"]
    for strategy in ("tpe", "random", "grid"):
        s = out[strategy]
        assert {"median_trials_to_3pct", "median_distinct_to_3pct", "reached", "runs"} <= set(s)
        assert 1 <= s["median_trials_to_3pct"] <= n and s["runs"] == 3
        assert s["median_distinct_to_3pct"] <= s["median_trials_to_3pct"]
    assert out["infeasible"] > 0 and out["memory_limit_bytes"] > 0


def test_sweep_enumerates_conditional_dimensions():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from _common import enumerate_space

    from autotune.search.space_file import load_space

    space = load_space(ROOT / "search_spaces" / "cpu.yaml", n_layer=2, seq_len=128)
    configs = list(enumerate_space(space))
    # workers 0: 1 way; workers 1, 2: x2 prefetch x2 persistent -> 1 + 8 = 9 data-loader ways;
    # checkpoint: 0, or 1..2 x 3 placements -> 7 ways
    assert len(configs) == 9 * 5 * 2 * 2 * 2 * 7
    assert all("prefetch_factor" not in p for p, c in configs if c.num_workers == 0)
