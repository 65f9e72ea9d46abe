"""The knob registry: each knob declared once, everything else made from it. A toy knob added in
one place (a registry entry and its apply function, in a copy of the package) shows up in `bench
--set`, a space file, a recipe, `export` and the docs table; docs/knobs.md's table is the
registry's; every place a knob is said to take effect exists."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autotune import registry

ROOT = Path(__file__).resolve().parent.parent


def test_the_docs_knob_table_is_the_registrys():
    text = (ROOT / "docs" / "knobs.md").read_text(encoding="utf-8")
    start, end = text.index("<!-- knobs:start -->\n"), text.index("<!-- knobs:end -->")
    assert text[start + len("<!-- knobs:start -->\n") : end].strip() == registry.markdown_table()


def test_every_knob_says_where_it_takes_effect_and_that_place_exists():
    for knob in registry.knobs_of():
        assert callable(registry.resolve(knob.applied)), knob.name
        if knob.apply:
            assert callable(registry.resolve(knob.apply)), knob.name
            # The allocator is set before the model is touched; the SDPA backend, a step's context,
            # also makes the model's attention what its kernel assumes (knobs.attention).
            assert knob.stage is registry.Stage.MODEL or knob.name in ("expandable_segments", "sdpa_backend")


def test_the_model_stage_runs_allocator_attention_loss_checkpoint_compile_then_the_ranks_wrap():
    # torchtitan's order: checkpointing, compile per block, then fully_shard per block and the root (or DDP)
    assert registry.MODEL_STAGE == (
        "expandable_segments",
        "sdpa_backend",
        "loss_impl",
        "checkpoint_layers",
        "compile_mode",
        "parallelism",
    )


def test_train_config_has_exactly_the_registrys_knobs_with_their_defaults():
    from autotune.config import TrainConfig

    cfg = TrainConfig()
    assert list(cfg.to_dict()) == list(registry.names())
    for knob in registry.knobs_of():
        assert getattr(cfg, knob.name) == knob.default


def test_a_value_outside_a_knobs_range_is_refused_with_its_name():
    from autotune.config import TrainConfig, parse_knob
    from autotune.errors import UsageError

    with pytest.raises(UsageError, match="token_budget must be an integer <= 1073741824"):
        TrainConfig(token_budget=1 << 31)
    with pytest.raises(UsageError, match=r"invalid value '9' \* 5000 for num_workers|invalid value .* for num_workers"):
        parse_knob("num_workers", "9" * 5000)  # never Python's digit-limit traceback


TOY_ENTRY = """
    Knob(
        "toy_scale",
        Kind.INTEGER,
        1,
        "a toy knob: scales the token embedding's weights by this",
        Stage.MODEL,
        "autotune.knobs.toy:apply_toy_knob",
        low=1,
        high=8,
        apply="autotune.knobs.toy:apply_toy_knob",
        apply_order=30,
    ),
"""
TOY_APPLY = '''"""A toy knob's apply function (tests/test_registry.py)."""

import os

import torch


def apply_toy_knob(model, cfg, where):
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(cfg.toy_scale)
            break
    with open(os.environ["TOY_LOG"], "a") as f:
        f.write(f"applied toy_scale={cfg.toy_scale} to {type(model).__name__}\\n")
    return model
'''
TOY_CHECKS = r"""
import json, sys
from click.testing import CliRunner
from autotune import registry
from autotune.cli import main
from autotune.config import TrainConfig
from autotune.recipe import Recipe
from autotune.space.file import load_space
from autotune.space.sampling import suggest
import optuna

out = {}
runner = CliRunner()
bench = runner.invoke(main, ["bench", "--model", "gpt2-tiny", "--device", "cpu", "--set", "toy_scale=3",
                             "--steps", "2", "--warmup", "0", "--min-time", "0", "--json"])
out["bench_code"] = bench.exit_code
out["bench_config"] = json.loads(bench.stdout)["config"] if bench.exit_code == 0 else bench.output
space = load_space(sys.argv[1], n_layer=2, seq_len=128)
study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
out["sampled"] = sorted({suggest(space, study.ask()).toy_scale for _ in range(20)})
recipe = Recipe(config=TrainConfig(toy_scale=5), model={"name": "gpt2-tiny", "seq_len": 128},
                measured={"tokens_per_sec": 1.0, "peak_memory_bytes": 1}, hardware={"kind": "cpu"},
                software={}, study={}, created="2026-01-01T00:00:00+00:00")
path = recipe.save(sys.argv[2])
out["recipe_back"] = Recipe.load(path).config.toy_scale
out["export_hf"] = runner.invoke(main, ["export", str(path), "--format", "hf"]).output
out["export_lightning"] = runner.invoke(main, ["export", str(path), "--format", "lightning"]).output
out["table"] = registry.markdown_table()
print(json.dumps(out))
"""


@pytest.mark.process
def test_a_toy_knob_added_in_one_place_is_everywhere(tmp_path):
    copy = tmp_path / "checkout"
    shutil.copytree(ROOT / "autotune", copy / "autotune", ignore=shutil.ignore_patterns("__pycache__"), symlinks=True)
    shutil.copytree(ROOT / "search_spaces", copy / "search_spaces")
    source = copy / "autotune" / "registry.py"
    text = source.read_text(encoding="utf-8")
    marker = "\n)\n\nBY_NAME"  # the end of the KNOBS tuple
    assert text.count(marker) == 1
    source.write_text(text.replace(marker, "\n" + TOY_ENTRY.rstrip() + marker.removeprefix("\n")), encoding="utf-8")
    (copy / "autotune" / "knobs" / "toy.py").write_text(TOY_APPLY, encoding="utf-8")
    space = tmp_path / "space.yaml"
    space.write_text("version: 1\ndimensions:\n  toy_scale: {choices: [2, 4]}\n  token_budget: {choices: [1024]}\n")
    log = tmp_path / "toy.log"
    env = {**os.environ, "PYTHONPATH": str(copy), "TOY_LOG": str(log)}
    done = subprocess.run(
        [sys.executable, "-c", TOY_CHECKS, str(space), str(tmp_path / "recipe.json")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["bench_code"] == 0, out["bench_config"]
    assert out["bench_config"]["toy_scale"] == 3
    assert "applied toy_scale=3 to GPT" in log.read_text()  # its apply function ran in the measured run
    assert out["sampled"] == [2, 4]
    assert out["recipe_back"] == 5
    assert "toy_scale=5" in out["export_hf"] and "toy_scale=5" in out["export_lightning"]
    assert "| `toy_scale` | an integer from 1 to 8 | `1` |" in out["table"]
