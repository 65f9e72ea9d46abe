"""A recipe's global batch: the `batch` section (micro-batch, accumulation steps, global batch)
written, read back and checked; older recipes without it accumulate nothing; the recipe API a
training loop uses; and the Hugging Face and Lightning exports, against the installed libraries."""

from __future__ import annotations

import ast
import json
import os
import tempfile

import pytest

from autotune.config import TrainConfig
from autotune.errors import UsageError
from autotune.integrations.export import render
from autotune.measure import outcomes
from autotune.recipe import Recipe

# Lightning and transformers' Trainer cost ~12 s of CPU to import in a process: the tests that
# import them share one xdist worker (conftest: --dist loadgroup), which pays it once.
pytestmark = pytest.mark.xdist_group("integrations")


def make_recipe(global_batch_tokens: int | None = 524288, **knobs) -> Recipe:
    return Recipe(
        config=TrainConfig(**{"token_budget": 8192, "amp_dtype": "bfloat16", **knobs}),
        model={"name": "gpt2", "seq_len": 1024, "n_layer": 12, "vocab_size": 50304},
        measured={"tokens_per_sec": 250000.0, "unstable": False},
        hardware={"kind": "cpu", "name": "a CPU"},
        study={"name": "gpt2-cpu", "trial": 3},
        global_batch_tokens=global_batch_tokens,
    )


def test_the_recipe_records_micro_batch_accumulation_and_global_batch():
    recipe = make_recipe()
    assert (recipe.micro_batch_tokens, recipe.accumulation_steps, recipe.global_batch_tokens) == (8192, 64, 524288)
    data = recipe.to_dict()
    assert data["batch"] == {"micro_batch_tokens": 8192, "accumulation_steps": 64, "global_batch_tokens": 524288}
    back = Recipe.from_dict(json.loads(json.dumps(data)))
    assert back.global_batch_tokens == 524288 and back.accumulation_steps == 64
    assert back.to_dict() == data


def test_a_recipe_without_a_batch_section_accumulates_nothing():
    data = make_recipe(None).to_dict()
    assert data["batch"] == {"micro_batch_tokens": 8192, "accumulation_steps": 1, "global_batch_tokens": None}
    del data["batch"]  # as recipes written before global batches existed
    old = Recipe.from_dict(data)
    assert old.accumulation_steps == 1 and old.global_batch_tokens is None and old.micro_batch_tokens == 8192


@pytest.mark.parametrize(
    "batch, message",
    [
        ({"micro_batch_tokens": 4096, "accumulation_steps": 64, "global_batch_tokens": 524288}, "token_budget is 8192"),
        ({"micro_batch_tokens": 8192, "accumulation_steps": 32, "global_batch_tokens": 524288}, "are not the global"),
        ({"accumulation_steps": 4, "global_batch_tokens": None}, "without a global_batch_tokens"),
        ({"global_batch_tokens": 10000}, "does not divide the global batch"),
        ({"global_batch_tokens": -1}, "expected a whole number"),
        ({"accumulation_steps": True, "global_batch_tokens": 8192}, "expected a whole number"),
        ([1, 2], "expected a mapping"),
    ],
)
def test_an_inconsistent_batch_section_is_refused_in_one_line(batch, message):
    data = make_recipe().to_dict()
    data["batch"] = batch
    with pytest.raises(UsageError, match=message):
        Recipe.from_dict(data)


def test_a_training_loop_steps_the_optimizer_every_accumulation_steps_micro_batches():
    recipe = make_recipe(4 * 8192)
    assert [i for i in range(12) if recipe.optimizer_step_due(i)] == [3, 7, 11]
    assert all(make_recipe(None).optimizer_step_due(i) for i in range(3))


# --- exports, against the installed libraries -----------------------------------------------------------


@pytest.fixture
def same_process_after():
    """TrainingArguments writes ACCELERATE_* variables and accelerate's device state."""
    from accelerate.state import PartialState

    environ = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(environ)
    PartialState._reset_state()


def test_hugging_face_arguments_reach_the_global_batch(same_process_after):
    transformers = pytest.importorskip("transformers")
    from autotune.integrations import hf

    recipe = make_recipe()
    args = hf.training_arguments(recipe)  # checked: the installed TrainingArguments accepts them
    assert args["per_device_train_batch_size"] == 8 and args["gradient_accumulation_steps"] == 64
    with tempfile.TemporaryDirectory() as out:
        built = transformers.TrainingArguments(output_dir=out, **args)
    # Sequences of the recipe's context per optimizer step, on one device: the global batch.
    assert built.per_device_train_batch_size * built.gradient_accumulation_steps * 1024 == 524288
    assert "gradient_accumulation_steps" not in hf.training_arguments(make_recipe(None))  # as before: Trainer's 1
    text = render(recipe, "hf")
    ast.parse(text)
    assert "gradient_accumulation_steps=64,  # 64 micro-batches of 8192 tokens: the global batch of 524288" in text
    assert "Global batch: 524288 tokens per optimizer step" in text


def test_lightning_trainer_accumulates_to_the_global_batch():
    pytest.importorskip("lightning")
    import lightning as pl

    from autotune.integrations import lightning

    recipe = make_recipe()
    kwargs = lightning.trainer_kwargs(recipe)  # checked: the installed Trainer accepts them
    assert kwargs["accumulate_grad_batches"] == 64
    assert lightning.dataloader_kwargs(recipe)["batch_size"] == 8
    trainer = pl.Trainer(**kwargs, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    assert trainer.accumulate_grad_batches == 64
    assert "accumulate_grad_batches" not in lightning.trainer_kwargs(make_recipe(None))
    text = render(recipe, "lightning")
    ast.parse(text)
    assert "accumulate_grad_batches=64,  # 64 micro-batches of 8192 tokens" in text


def test_verify_measures_at_the_recipes_global_batch(monkeypatch):
    """`verify` re-measures what the recipe recorded: accumulating to its global batch."""
    from autotune.recipe import verify
    from autotune.trial.runner import TrialResult

    specs = []

    def run_trial(spec, cfg, **kwargs):
        specs.append(spec)
        return TrialResult(outcomes.CRASHED, "not run: this test reads the spec")

    monkeypatch.setattr(verify, "run_trial", run_trial)
    recipe = make_recipe(4 * 1024, token_budget=1024, amp_dtype="float32")
    recipe.model = {"name": "gpt2-tiny", "seq_len": 128}
    recipe.measured = {"tokens_per_sec": 1000.0}
    verify.verify_recipe(recipe, device="cpu", tolerance=0.15, steps=2, warmup=1, min_time_s=0)
    assert [spec.global_batch_tokens for spec in specs] == [4096]
