"""autotune.recipe.export: the recipe file as JSON and YAML, and Hugging Face / Lightning snippets
that parse as Python and say what they cannot express."""

from __future__ import annotations

import ast
import json

import pytest
import yaml

from autotune.config import TrainConfig
from autotune.errors import UsageError
from autotune.recipe import Recipe
from autotune.recipe.export import FORMATS, render
from tests.helpers import invoke


def make_recipe(**knobs) -> Recipe:
    return Recipe(
        config=TrainConfig(**knobs),
        model={"name": "gpt2", "seq_len": 1024, "n_layer": 12, "vocab_size": 50304},
        measured={"tokens_per_sec": 250000.0, "peak_memory_bytes": 40 * 2**30},
        hardware={"kind": "cuda", "name": "NVIDIA H200"},
        software={"torch": "2.13.0"},
        study={"name": "gpt2-nvidia-h200", "trial": 17},
        created="2026-01-01T00:00:00+00:00",
    )


TUNED = dict(
    num_workers=4,
    prefetch_factor=2,
    pin_memory=True,
    persistent_workers=True,
    token_budget=16384,
    amp_dtype="bfloat16",
    compile_mode="max-autotune",
    sdpa_backend="flash",
    checkpoint_layers=(0, 1, 5),
)


def assigned_dict(source: str, name: str) -> dict:
    """The keyword arguments of `name = dict(...)` in `source`, read without running it."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == name:
            call = node.value
            assert isinstance(call, ast.Call) and call.func.id == "dict" and not call.args
            return {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
    raise AssertionError(f"no `{name} = dict(...)` in:\n{source}")


def test_json_is_the_recipe_file(tmp_path):
    recipe = make_recipe(**TUNED)
    text = render(recipe, "json")
    assert text == recipe.save(tmp_path / "r.json").read_text()
    assert Recipe.from_dict(json.loads(text)) == recipe


def test_yaml_is_the_same_data():
    recipe = make_recipe(**TUNED)
    data = yaml.safe_load(render(recipe, "yaml"))
    assert data == recipe.to_dict()
    assert Recipe.from_dict(data) == recipe


def test_unknown_format_lists_the_formats(tmp_path):
    with pytest.raises(UsageError, match=r"unknown export format 'toml'; formats: json, yaml, hf, lightning$"):
        render(make_recipe(), "toml")
    # Each format the error lists is rendered, and `autotune export --format` offers it.
    recipe = make_recipe(**TUNED)
    path = recipe.save(tmp_path / "r.json")
    for fmt in FORMATS:
        text = render(recipe, fmt)
        assert text.endswith("\n") and text.strip(), fmt
        result = invoke("export", str(path), "--format", fmt)
        assert result.exit_code == 0 and result.stdout == text, (fmt, result.output)


def test_hf_tuned_recipe():
    text = render(make_recipe(**TUNED), "hf")
    args = assigned_dict(text, "training_args")
    assert args == {
        "per_device_train_batch_size": 16,  # 16384 // 1024
        "dataloader_num_workers": 4,
        "dataloader_pin_memory": True,
        "dataloader_prefetch_factor": 2,
        "dataloader_persistent_workers": True,
        "bf16": True,
        "fp16": False,
        "tf32": False,
        "torch_compile": True,
        "torch_compile_mode": "max-autotune",
        "gradient_checkpointing": True,
        "group_by_length": True,
    }
    # What TrainingArguments cannot say is said in comments.
    assert "blocks [0, 1, 5] of 12" in text
    assert 'attn_implementation="sdpa"' in text
    assert "sdpa_kernel([SDPBackend.FLASH_ATTENTION])" in text
    assert "token budget" in text and "group_by_length=True is the closest" in text


@pytest.mark.parametrize(
    "amp,flags", [("float16", (False, True, False)), ("tf32", (False, False, True)), ("float32", (False, False, False))]
)
def test_hf_precision_variants(amp, flags):
    args = assigned_dict(render(make_recipe(amp_dtype=amp, batching="fixed", token_budget=512), "hf"), "training_args")
    assert (args["bf16"], args["fp16"], args["tf32"]) == flags
    assert args["torch_compile"] is False and args["torch_compile_mode"] is None
    assert args["gradient_checkpointing"] is False
    assert args["dataloader_prefetch_factor"] is None  # no workers
    assert args["per_device_train_batch_size"] == 1  # 512 // 1024, at least one
    assert "group_by_length" not in args  # fixed batching: nothing to group


def test_lightning_tuned_recipe():
    text = render(make_recipe(**TUNED), "lightning")
    assert assigned_dict(text, "trainer_kwargs") == {"precision": "bf16-mixed"}
    assert assigned_dict(text, "dataloader_kwargs") == {
        "batch_size": 16,
        "num_workers": 4,
        "pin_memory": True,
        "prefetch_factor": 2,
        "persistent_workers": True,
    }
    assert "torch.utils.checkpoint" in text and "configure_model" in text
    assert "apply_to_model" in text
    assert 'block.compile(mode="max-autotune")' in text
    assert "set_float32_matmul_precision" not in text


@pytest.mark.parametrize("amp,precision", [("float16", "16-mixed"), ("float32", "32-true"), ("tf32", "32-true")])
def test_lightning_precision_variants(amp, precision):
    text = render(make_recipe(amp_dtype=amp), "lightning")
    assert assigned_dict(text, "trainer_kwargs") == {"precision": precision}
    tree = ast.parse(text)
    calls = [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Call)]
    assert ("torch.set_float32_matmul_precision('high')" in calls) is (amp == "tf32")
    if amp == "tf32":
        assert "import torch" in text


def test_snippets_without_a_recorded_seq_len():
    recipe = make_recipe(batching="packed")
    recipe.model = {}
    for fmt in ("hf", "lightning"):
        text = render(recipe, fmt)
        ast.parse(text)
        assert "records no seq_len" in text
