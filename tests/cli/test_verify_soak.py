"""`autotune verify --soak` end to end (issue 16, item 3): gpt2-tiny on this CPU, over one
epoch of a small text corpus, in a trial process: every batch shape stepped on, throughput and
peak memory per window, the verdict against the recipe's limit less its headroom."""

from __future__ import annotations

import json

import pytest

from autotune.config import TrainConfig
from autotune.recipe.recipe import Recipe
from tests.helpers import invoke

GiB = 1 << 30


@pytest.mark.process
def test_verify_soak_runs_an_epoch_of_every_shape_and_judges_its_memory(tmp_path):
    docs = [("lorem ipsum " * (1 + (7 * k) % 10))[: 2 + (37 * k) % 120] for k in range(60)]
    (tmp_path / "docs.txt").write_text("\n\n".join(docs))
    recipe = Recipe(
        config=TrainConfig(token_budget=512),
        model={"name": "gpt2-tiny", "seq_len": 128},
        data="docs.txt",
        measured={"tokens_per_sec": 1e4, "memory_limit_bytes": 16 * GiB, "memory_headroom": 0.05},
        hardware={"kind": "cpu"},
    )
    path = recipe.save(tmp_path / "tiny.json")
    data = str(tmp_path / "docs.txt")
    result = invoke("verify", str(path), "--soak", "--device", "cpu", "--warmup", "0", "--data", data, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["outcome"] == "ok" and report["passed"] and report["reason"] is None
    assert report["steps"] == report["epoch_steps"] >= 5  # one epoch
    assert report["shapes_seen"] == report["shapes_total"] > 1  # every batch shape
    windows = report["windows"]
    assert [w["end_step"] for w in windows][-1] == report["steps"] and sum(w["steps"] for w in windows) == report[
        "steps"
    ]
    assert windows and all(w["tokens_per_sec"] > 0 and w["peak_memory_bytes"] > 0 for w in windows)
    assert report["max_memory_bytes"] == max(w["peak_memory_bytes"] for w in windows)
    assert (
        report["memory_target_bytes"] == int(16 * GiB * 0.95) and report["creep_horizon_steps"] == 10 * report["steps"]
    )
