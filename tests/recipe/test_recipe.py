"""autotune.recipe.recipe, the recipe file: load and save (JSON and YAML), refusals (a newer
version, unknown keys, Python tags), and the warning when it was measured elsewhere."""

from __future__ import annotations

import json
import warnings

import pytest
import yaml

import autotune
from autotune.config import TrainConfig
from autotune.errors import RecipeEnvironmentWarning, UsageError
from autotune.recipe.recipe import FORMAT, Recipe
from tests.helpers import cpu_recipe


def write_raw(tmp_path, raw: dict, name: str = "r.json"):
    path = tmp_path / name
    path.write_text(json.dumps(raw))
    return path


def test_exported_from_package():
    assert autotune.Recipe is Recipe
    assert set(autotune.__all__) == {"Recipe", "__version__"}


def test_save_load_round_trip_json_and_yaml(tmp_path):
    recipe = cpu_recipe(num_workers=2, prefetch_factor=4, amp_dtype="bfloat16", checkpoint_layers=(1, 0))
    path = recipe.save(tmp_path / "sub" / "r.json")
    loaded = Recipe.load(path, check_environment=False)
    assert loaded == recipe
    assert loaded.config.checkpoint_layers == (0, 1)
    yaml_path = tmp_path / "r.yaml"
    yaml_path.write_text(yaml.safe_dump(recipe.to_dict()))
    assert Recipe.load(yaml_path, check_environment=False) == recipe


def test_newer_version_is_refused(tmp_path):
    raw = cpu_recipe().to_dict() | {"version": 2}
    with pytest.raises(UsageError, match="newer than this autotune reads"):
        Recipe.load(write_raw(tmp_path, raw))


def test_unknown_key_is_refused(tmp_path):
    raw = cpu_recipe().to_dict() | {"surprise": 1}
    with pytest.raises(UsageError, match="unknown key 'surprise'"):
        Recipe.load(write_raw(tmp_path, raw))


def test_python_tags_are_refused_and_never_run(tmp_path):
    target = tmp_path / "FILE"
    text = (
        f"format: {FORMAT}\nversion: 1\nconfig: {{}}\n"
        f'data: !!python/object/apply:os.system ["echo hacked > {target}"]\n'
    )
    path = tmp_path / "evil.yaml"
    path.write_text(text)
    with pytest.raises(UsageError, match="not a valid recipe file"):
        Recipe.load(path)
    assert not target.exists()


def test_recipe_from_other_hardware_warns_once(tmp_path):
    recipe = cpu_recipe()
    recipe.hardware = {**recipe.hardware, "name": "Imaginary Accelerator 9000"}
    path = recipe.save(tmp_path / "elsewhere.json")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Recipe.load(path)
    env = [w for w in caught if issubclass(w.category, RecipeEnvironmentWarning)]
    assert len(env) == 1
    assert "Imaginary Accelerator 9000" in str(env[0].message)

    same = cpu_recipe().save(tmp_path / "here.json")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Recipe.load(same)
    assert not [w for w in caught if issubclass(w.category, RecipeEnvironmentWarning)]


def test_a_recipe_made_here_from_a_pypi_cuda_wheel_is_not_from_elsewhere(tmp_path, monkeypatch):
    """PyPI's CUDA wheels say "2.9.1" in their metadata (what a recipe records, read without
    importing torch) while torch.__version__ says "2.9.1+cu128": compared with the latter, a
    recipe made here warned that it came from elsewhere. Another release, or another build of
    this one, still warns."""
    import importlib.metadata

    import torch

    public = torch.__version__.split("+")[0]
    real_version = importlib.metadata.version
    monkeypatch.setattr(torch, "__version__", f"{public}+cu128")
    monkeypatch.setattr(importlib.metadata, "version", lambda name: public if name == "torch" else real_version(name))
    recipe = cpu_recipe()
    assert recipe.software["torch"] == public
    assert recipe.differences_from_here() == []
    assert Recipe.load(recipe.save(tmp_path / "here.json")).software["torch"] == public
    for other in ("2.4.0", f"{public}+cu126"):
        recipe.software = {**recipe.software, "torch": other}
        assert recipe.differences_from_here() == [f"torch {other} there, {public} here"]


def test_recipe_round_trip(tmp_path):
    recipe = Recipe(
        config=TrainConfig(
            num_workers=2,
            prefetch_factor=4,
            persistent_workers=True,
            token_budget=4096,
            batching="packed",
            amp_dtype="bfloat16",
            sdpa_backend="flash",
            checkpoint_layers=(0, 2),
        ),
        model={"name": "gpt2-tiny", "seq_len": 128, "n_layer": 2},
        measured={"tokens_per_sec": 1234.5, "peak_memory_bytes": 10**9, "memory_limit_bytes": 2 * 10**9},
        reference_speedups={"baseline": 2.5, "checklist": None},
        hardware={"name": "cpu", "kind": "cpu"},
        software={"torch": "2.9.1"},  # any version: read back as written (check_environment=False)
        study={"name": "s", "storage": "sqlite:///studies/s.db", "trial": 3},
        created="2026-01-01T00:00:00+00:00",
    )
    path = recipe.save(tmp_path / "r.json")
    loaded = Recipe.load(path, check_environment=False)
    assert loaded.to_dict() == recipe.to_dict()
    assert loaded.config == recipe.config and loaded.config.checkpoint_layers == (0, 2)
    assert json.loads(path.read_text())["format"] == "autotune.recipe"
