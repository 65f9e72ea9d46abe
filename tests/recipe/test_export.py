"""autotune.integrations.export: the recipe file as JSON and YAML, and Hugging Face / Lightning snippets
that parse as Python and say what they cannot express."""

from __future__ import annotations

import ast
import json

import pytest
import yaml

from autotune.config import TrainConfig
from autotune.errors import UsageError
from autotune.integrations import hf, lightning
from autotune.integrations.export import FORMATS, GENERATION_FORMATS, render
from autotune.recipe import Recipe
from tests.helpers import TUNED, invoke

# Lightning and transformers' Trainer cost ~12 s of CPU to import in a process: the tests that
# import them share one xdist worker (conftest: --dist loadgroup), which pays it once.
pytestmark = pytest.mark.xdist_group("integrations")


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
    formats = (
        "json, yaml, hf, hf-json, lightning, lightning-json, env, torchrun, hf-generate, hf-generate-json, decode-loop"
    )
    with pytest.raises(UsageError, match=rf"unknown export format 'toml'; formats: {formats}$"):
        render(make_recipe(), "toml")
    # Each format of a training recipe the error lists is rendered, and `autotune export --format`
    # offers it (a generation recipe's: tests/recipe/test_generation_recipe.py).
    recipe = make_recipe(**TUNED)
    path = recipe.save(tmp_path / "r.json")
    for fmt in [f for f in FORMATS if f not in GENERATION_FORMATS]:
        text = render(recipe, fmt)
        assert text.endswith("\n") and text.strip(), fmt
        result = invoke("export", str(path), "--format", fmt)
        assert result.exit_code == 0 and result.stdout == text, (fmt, result.output)


def test_hf_tuned_recipe():
    """The snippet's arguments are `hf.training_arguments` (their values, in the installed
    transformers' names, are pinned in tests/recipe/test_integrations.py); what they cannot
    say is said in comments."""
    recipe = make_recipe(**TUNED)
    text = render(recipe, "hf")
    assert assigned_dict(text, "training_args") == hf.training_arguments(recipe)
    assert "# - The recipe checkpoints blocks [0, 1, 5] of 12 only; TrainingArguments checkpoints every block" in text
    assert '# - The recipe compiles each block (block.compile(mode="max-autotune-no-cudagraphs")); Trainer' in text
    assert "recipe.apply_to_model(model) and hf.training_arguments(recipe, model_applied=True)" in text
    assert 'attn_implementation="sdpa"' in text
    assert "#     with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):\n#         trainer.train()\n" in text
    assert "by token budget (16384 tokens a step, padding included); grouping by length" in text


@pytest.mark.parametrize(
    "amp,flags",
    [
        ("float16", {"bf16": False, "fp16": True}),
        ("tf32", {"bf16": False, "fp16": False, "tf32": True}),  # tf32 only when asked: False would undo the user's
        ("float32", {"bf16": False, "fp16": False}),
    ],
)
def test_hf_precision_variants(amp, flags):
    args = assigned_dict(render(make_recipe(amp_dtype=amp, batching="fixed", token_budget=512), "hf"), "training_args")
    # No compile, checkpointing, length grouping, prefetch (refused without workers) or use_cpu (a GPU recipe).
    assert args == {
        "per_device_train_batch_size": 1,  # 512 // 1024, at least one
        "dataloader_num_workers": 0,
        "dataloader_pin_memory": False,
        "dataloader_persistent_workers": False,
        **flags,
    }


def test_lightning_tuned_recipe():
    """The snippet's arguments are `lightning.trainer_kwargs` / `dataloader_kwargs` (their values
    are pinned in tests/recipe/test_integrations.py); checkpointing and compile, which no
    argument sets, are named with the calls that do them."""
    recipe = make_recipe(**TUNED)
    text = render(recipe, "lightning")
    assert assigned_dict(text, "trainer_kwargs") == lightning.trainer_kwargs(recipe)
    assert assigned_dict(text, "dataloader_kwargs") == lightning.dataloader_kwargs(recipe)
    assert "# - The recipe checkpoints blocks [0, 1, 5] of 12 (torch.utils.checkpoint.checkpoint" in text
    assert 'then compiles each block (block.compile(mode="max-autotune-no-cudagraphs"))' in text
    assert "call recipe.apply_to_model(self.model) in LightningModule.configure_model" in text
    assert "#     with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):\n#         trainer.fit(...)\n" in text
    assert "set_float32_matmul_precision" not in text


@pytest.mark.parametrize(
    "scope,hf_note,lightning_note",
    [
        (
            "blocks+head",
            'The recipe compiles each block (block.compile(mode="default")) and the head '
            '(torch.compile(model.head_loss, mode="default")); Trainer\'s torch_compile compiles the whole model.',
            'The recipe compiles each block (block.compile(mode="default")) and the head '
            '(torch.compile(model.head_loss, mode="default")): call recipe.apply_to_model(self.model)',
        ),
        (
            "model",
            "The recipe compiles the whole model, as Trainer's torch_compile does.",
            'The recipe compiles the whole model (model.compile(mode="default")): call recipe.apply_to_model',
        ),
    ],
)
def test_snippets_name_the_compile_scope(scope, hf_note, lightning_note):
    recipe = make_recipe(compile_mode="default", compile_scope=scope)
    hf_text, lightning_text = render(recipe, "hf"), render(recipe, "lightning")
    assert f"# - {hf_note}" in hf_text and "each block" not in hf_text.replace(hf_note, "")
    assert f"# - {lightning_note}" in lightning_text
    assert ("model_applied=True" in hf_text) is (scope != "model")  # Trainer's own compile is the recipe's


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


def test_a_cpu_flash_and_chunked_recipe_says_what_the_model_needs():
    """The hf export advised a forced flash kernel and the chunked loss that then failed on HF
    GPT-2 (its attention dropout; no seam): it says what apply_to_model does for each."""
    recipe = make_recipe(sdpa_backend="flash", loss_impl="chunked", amp_dtype="float32")
    recipe.hardware = {"kind": "cpu", "name": "a CPU"}
    for text in (render(recipe, "hf"), render(recipe, "lightning")):
        assert "A CPU's flash kernel runs no attention dropout (GPT-2 keeps 0.1): recipe.apply_to_model" in text
        assert "on a transformers causal LM (its loss from the decoder's hidden states and lm_head" in text
    recipe.hardware = {"kind": "cuda", "name": "NVIDIA H200"}  # CUDA's flash runs dropout
    assert "attention dropout" not in render(make_recipe(sdpa_backend="flash", amp_dtype="bfloat16"), "hf")
