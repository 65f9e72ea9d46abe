"""The knob registry: each knob declared once, everything else made from it. A toy knob of each
stage added in one place (a registry entry, its function, and that function's line in its stage's
list, in a copy of the package) takes effect in a measured run and shows up in `bench --set`, a
space file, a recipe, `export` and the docs table; docs/knobs.md's table is the registry's; every
place a knob is said to take effect exists."""

from __future__ import annotations

import json
import os
import pkgutil
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
        assert callable(pkgutil.resolve_name(knob.applied)), knob.name


def test_the_model_stage_runs_allocator_threads_attention_loss_checkpoint_compile_then_the_ranks_wrap():
    from autotune.knobs import allocator, apply, attention, checkpoint, compile, loss, parallel, process

    # torchtitan's order: checkpointing, compile per block, then fully_shard per block and the root (or DDP)
    assert apply.MODEL_STAGE == (
        allocator.apply_allocator_knob,
        process.apply_threads_knob,
        attention.apply_attention_knob,
        loss.apply_loss_knob,
        checkpoint.apply_checkpoint_knob,
        compile.apply_compile_knob,
        parallel.apply_parallel_knob,
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


# A toy knob of each stage, as a developer adds them: the registry entries (a loader knob's hook is its
# entry's `loader` mapping), their functions in a module of their own, each listed in its stage's tuple.
TOY_ENTRIES = """
    Knob("toy_env", Kind.INTEGER, 1, "a toy process knob: TOY_PROCESS_VALUE in the trial process's environment",
         Stage.PROCESS, "autotune.knobs.toy:toy_env", low=1, high=8),
    Knob("toy_in_order", Kind.BOOLEAN, True, "a toy loader knob: the DataLoader's in_order", Stage.LOADER,
         "autotune.data.batching:build_dataloader", loader=lambda v, view: {"in_order": v}),
    Knob("toy_scale", Kind.INTEGER, 1, "a toy knob: scales the token embedding's weights by this", Stage.MODEL,
         "autotune.knobs.toy:apply_toy_knob", low=1, high=8),
    Knob("toy_eps", Kind.INTEGER, 8, "a toy optimizer knob: AdamW's eps is 10^-toy_eps", Stage.OPTIMIZER,
         "autotune.knobs.toy:toy_optimizer", low=1, high=12),
    Knob("toy_note", Kind.INTEGER, 0, "a toy step knob: its context notes each forward pass", Stage.STEP,
         "autotune.knobs.toy:toy_step", high=9),
"""
TOY_HOOKS = '''"""A toy knob of each stage (tests/test_registry.py): each hook leaves its mark in TOY_LOG."""

import contextlib
import os

import torch


def _note(line):
    with open(os.environ["TOY_LOG"], "a") as f:
        f.write(line + "\\n")


def toy_env(cfg, environ):
    return {"TOY_PROCESS_VALUE": str(cfg.toy_env)}


def apply_toy_knob(model, cfg, where):
    with torch.no_grad():
        next(model.parameters()).mul_(cfg.toy_scale)
    value = os.getenv("TOY_PROCESS_VALUE")
    _note(f"model: toy_scale={cfg.toy_scale} on {type(model).__name__}, TOY_PROCESS_VALUE={value}")
    return model


def toy_optimizer(cfg):
    return {"eps": 10.0 ** -cfg.toy_eps}


@contextlib.contextmanager
def toy_step(device_kind, cfg):
    _note(f"step: toy_note={cfg.toy_note}, a forward pass on {device_kind}")
    yield
'''
# Each hook's line in its stage's list (module, text there, the text with the hook): where a stage has
# no list, nothing is added, and the measured runs below show the knob taking no effect.
TOY_PLACES = (
    ("knobs/process.py", "import allocator_env\n", "import allocator_env\nfrom autotune.knobs.toy import toy_env\n"),
    (
        "knobs/process.py",
        "PROCESS_STAGE = (allocator_env, threads_env)",
        "PROCESS_STAGE = (allocator_env, threads_env, toy_env)",
    ),
    (
        "knobs/apply.py",
        "\nMODEL_STAGE = (",
        "from autotune.knobs.toy import apply_toy_knob, toy_optimizer, toy_step\n\nMODEL_STAGE = (",
    ),
    ("knobs/apply.py", "    apply_checkpoint_knob,", "    apply_toy_knob,\n    apply_checkpoint_knob,"),
    (
        "knobs/apply.py",
        "OPTIMIZER_STAGE: tuple[Callable[[TrainConfig], dict[str, Any]], ...] = ()",
        "OPTIMIZER_STAGE = (toy_optimizer,)",
    ),
    ("knobs/apply.py", "STEP_STAGE = (\n", "STEP_STAGE = (\n    toy_step,\n"),
)
TOY_CHECKS = r"""
import json, sys
import optuna
import torch
from click.testing import CliRunner
from autotune import registry
from autotune.cli import main
from autotune.config import RunSpec, TrainConfig
from autotune.recipe import Recipe
from autotune.space.file import load_space
from autotune.space.sampling import suggest
from autotune.trial.runner import run_trial

out = {"loader_in_order": [], "optimizer_eps": []}
made_loader, made_optimizer = torch.utils.data.DataLoader.__init__, torch.optim.AdamW.__init__

def loader(self, *args, **kwargs):  # what each DataLoader of the measured run was made with
    made_loader(self, *args, **kwargs)
    out["loader_in_order"].append(self.in_order)

def optimizer(self, *args, **kwargs):
    made_optimizer(self, *args, **kwargs)
    out["optimizer_eps"].append(self.defaults["eps"])

torch.utils.data.DataLoader.__init__, torch.optim.AdamW.__init__ = loader, optimizer
runner = CliRunner()
# 1024-token steps (the default is 8192, in nine batch shapes to warm up): each toy's mark is made as well
sets = [a for s in ("toy_scale=3", "toy_in_order=false", "toy_eps=3", "toy_note=5", "token_budget=1024")
        for a in ("--set", s)]
bench = runner.invoke(main, ["bench", "--model", "gpt2-tiny", "--device", "cpu", *sets,
                             "--steps", "2", "--warmup", "0", "--min-time", "0", "--json"])
out["bench_code"] = bench.exit_code
out["bench_config"] = json.loads(bench.stdout)["config"] if bench.exit_code == 0 else bench.output
# bench measures in its own process: the process stage acts on a trial process
spec = RunSpec(model="gpt2-tiny", device="cpu", warmup=0, steps=2, min_time_s=0)
trial = run_trial(spec, TrainConfig(toy_env=4, toy_scale=2, token_budget=1024), timeout_s=240)
out["trial"] = [trial.outcome, trial.reason]
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
    source.write_text(text.replace(marker, "\n" + TOY_ENTRIES.strip("\n") + marker), encoding="utf-8")
    (copy / "autotune" / "knobs" / "toy.py").write_text(TOY_HOOKS, encoding="utf-8")
    for module, there, with_hook in TOY_PLACES:
        path = copy / "autotune" / module
        if path.exists() and there in path.read_text(encoding="utf-8"):
            path.write_text(path.read_text(encoding="utf-8").replace(there, with_hook, 1), encoding="utf-8")
    space = tmp_path / "space.yaml"
    space.write_text("version: 1\ndimensions:\n  toy_scale: {choices: [2, 4]}\n  token_budget: {choices: [1024]}\n")
    log = tmp_path / "toy.log"
    log.touch()
    env = {**os.environ, "PYTHONPATH": str(copy), "TOY_LOG": str(log)}
    done = subprocess.run(
        [sys.executable, "-c", TOY_CHECKS, str(space), str(tmp_path / "recipe.json")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["bench_code"] == 0, out["bench_config"]
    assert out["trial"][0] == "ok", out["trial"]
    notes = log.read_text()
    took_effect = {  # each stage's toy in the measured runs
        # the trial process started with the process hook's variable (its model hook read it there)
        "process": "model: toy_scale=2 on GPT, TOY_PROCESS_VALUE=4" in notes,
        "loader": set(out["loader_in_order"]) == {False},  # every DataLoader bench made
        "model": "model: toy_scale=3 on GPT, TOY_PROCESS_VALUE=None" in notes,  # bench, in its own process
        "optimizer": set(out["optimizer_eps"]) == {1e-3},
        "step": "step: toy_note=5, a forward pass on cpu" in notes,
    }
    assert took_effect == dict.fromkeys(took_effect, True), (took_effect, notes, out)
    assert {name: out["bench_config"][name] for name in ("toy_scale", "toy_in_order", "toy_eps", "toy_note")} == {
        "toy_scale": 3,
        "toy_in_order": False,
        "toy_eps": 3,
        "toy_note": 5,
    }
    assert out["sampled"] == [2, 4]
    assert out["recipe_back"] == 5
    assert "toy_scale=5" in out["export_hf"] and "toy_scale=5" in out["export_lightning"]
    assert "| `toy_scale` | an integer from 1 to 8 | `1` |" in out["table"]
    assert "| `toy_eps` | an integer from 1 to 12 | `8` |" in out["table"]
