"""The allocator setting travels with the recipe (issue 16, item 2): `Recipe.environment()` is
what to set before CUDA starts, and every export carries it (hf and lightning as Python that
sets it first, lightning-json as a key, env as shell exports). hf-json is TrainingArguments'
keyword arguments alone, which have no place for it."""

from __future__ import annotations

import ast
import json
import os
import subprocess

import pytest

from autotune.integrations.export import render
from tests.recipe.test_export import make_recipe

# Lightning and transformers' Trainer cost ~12 s of CPU to import in a process: the tests that
# import them share one xdist worker (conftest: --dist loadgroup), which pays it once.
pytestmark = pytest.mark.xdist_group("integrations")

ON = "PYTORCH_CUDA_ALLOC_CONF"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    monkeypatch.delenv(ON, raising=False)
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)


def test_the_environment_states_the_measured_setting_explicitly():
    assert make_recipe(expandable_segments=True).environment() == {ON: "expandable_segments:True"}
    # Measured without: said too, so a shell that turns it on cannot change what was measured.
    assert make_recipe(expandable_segments=False).environment() == {ON: "expandable_segments:False"}


def test_the_users_other_allocator_options_are_kept(monkeypatch):
    monkeypatch.setenv(ON, "max_split_size_mb:512,expandable_segments:False")
    assert make_recipe(expandable_segments=True).environment() == {ON: "max_split_size_mb:512,expandable_segments:True"}


def test_a_cpu_recipe_without_the_option_sets_nothing():
    recipe = make_recipe()
    recipe.hardware = {"kind": "cpu", "name": "x86_64"}
    assert recipe.environment() == {}
    assert render(recipe, "env") == "# nothing to set: the recipe was measured on a CPU without allocator settings\n"


def test_the_env_export_is_shell_that_sets_it():
    text = render(make_recipe(expandable_segments=True), "env")
    shown = subprocess.run(["sh", "-c", f'{text}\nprintf %s "${ON}"'], capture_output=True, text=True, check=True)
    assert shown.stdout == "expandable_segments:True"


@pytest.mark.parametrize("fmt", ["hf", "lightning"])
@pytest.mark.slow
def test_the_python_exports_set_it_before_anything_else(fmt, monkeypatch):
    text = render(make_recipe(expandable_segments=True), fmt)
    monkeypatch.setitem(os.environ, ON, "")  # restored (unset) after the test
    body = ast.parse(text).body
    assert isinstance(body[0], ast.Import) and body[0].names[0].name == "os"
    namespace: dict = {}
    exec(compile(ast.Module(body=body[:2], type_ignores=[]), fmt, "exec"), namespace)  # noqa: S102
    assert os.environ[ON] == "expandable_segments:True"


def test_lightning_json_carries_the_environment():
    data = json.loads(render(make_recipe(expandable_segments=True), "lightning-json"))
    assert data["environment"] == {ON: "expandable_segments:True"}
