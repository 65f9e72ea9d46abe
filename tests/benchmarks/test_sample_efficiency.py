"""benchmarks/sample_efficiency.py and _common.py: the sampler's replay on the recorded sweep
(benchmarks/data/cpu_gpt2_tiny_sweep.json), and the sweep's enumeration of a space."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys

import pytest
from optuna.trial import FixedTrial

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


@pytest.mark.slow
def test_sweep_enumerates_conditional_dimensions():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from _common import enumerate_space

    from autotune.space.file import load_space
    from autotune.space.sampling import suggest

    space = load_space(ROOT / "search_spaces" / "cpu.yaml", n_layer=2, seq_len=128)
    configs = list(enumerate_space(space))

    # The count, read off the space: every dimension multiplies it, except the conditional
    # ones, which multiply only the values their condition holds for.
    dims = space.dimensions
    conditional = {name: dim.when for name, dim in dims.items() if dim.when}
    assert conditional == {  # the conditions counted below (a new one must be counted too)
        "prefetch_factor": {"num_workers": {"gt": 0}},
        "persistent_workers": {"num_workers": {"gt": 0}},
        "compile_scope": {"compile_mode": "default"},
    }
    ways = {name: len(dim.choices) for name, dim in dims.items()}
    with_workers = sum(w > 0 for w in dims["num_workers"].choices)
    loader = ways["num_workers"] - with_workers + with_workers * ways["prefetch_factor"] * ways["persistent_workers"]
    compiling = sum(m == "default" for m in dims["compile_mode"].choices)
    compile_ways = ways["compile_mode"] - compiling + compiling * ways["compile_scope"]
    unconditional = math.prod(
        n for name, n in ways.items() if name not in {"num_workers", "compile_mode"} and name not in conditional
    )
    # Checkpointing: none, all (whatever the placement), or a partial count in each placement.
    n_layer, placements = space.n_layer, len(space.checkpoint.placements)
    count = space.checkpoint.count
    assert (count.low, count.high, count.step) == (0, n_layer, 1)
    checkpoint_ways = 2 + (n_layer - 1) * placements
    assert len(configs) == loader * compile_ways * unconditional * checkpoint_ways

    # Each point of the space once (two placements may still give the same blocks: of two
    # blocks, "last" and "spread" are both block 1).
    assert len({json.dumps(p, sort_keys=True) for p, _ in configs}) == len(configs)
    # The params are exactly those `suggest` asks, and give cfg: on 500 configurations drawn
    # across the space (all 28,800 take ~5 s; a wrong walk shows up in any sizeable sample).
    for params, cfg in random.Random(0).sample(configs, 500):
        trial = FixedTrial(params)
        assert suggest(space, trial) == cfg
        assert trial.params == params
    assert all("prefetch_factor" not in p for p, c in configs if c.num_workers == 0)
    assert all("compile_scope" not in p for p, c in configs if c.compile_mode == "none")
    assert all("checkpoint_placement" not in p for p, c in configs if len(c.checkpoint_layers) in (0, n_layer))
