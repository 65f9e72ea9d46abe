"""Exports the installed libraries accept: `autotune.integrations.hf.training_arguments` and
`lightning.trainer_kwargs` as data, in the field names of the installed versions, checked by
constructing `TrainingArguments` / `lightning.Trainer`; `export --format hf|hf-json|lightning|
lightning-json` on the command line. Against the real transformers, accelerate and Lightning."""

from __future__ import annotations

import importlib
import json
import os
import tempfile

import pytest
import torch
from click.testing import CliRunner

from autotune.cli import main
from autotune.config import TrainConfig
from autotune.errors import AutotuneError
from autotune.integrations import hf, lightning
from autotune.integrations.export import render
from autotune.recipe import Recipe
from tests.helpers import HF, TUNED, lazy

# Lightning and transformers' Trainer cost ~12 s of CPU to import in a process: the tests that
# import them share one xdist worker (conftest: --dist loadgroup), which pays it once.
pytestmark = HF
transformers = lazy("transformers")


def transformers_version() -> str:
    return importlib.import_module("transformers").__version__


def five() -> bool:
    return int(transformers_version().split(".")[0]) >= 5


def make_recipe(kind: str = "cuda", **knobs) -> Recipe:
    return Recipe(
        config=TrainConfig(**knobs),
        model={"name": "gpt2", "seq_len": 1024, "n_layer": 12, "vocab_size": 50304},
        measured={"tokens_per_sec": 250000.0, "unstable": False},
        hardware={"kind": kind, "name": "NVIDIA H200" if kind == "cuda" else "a CPU"},
        study={"name": "gpt2-nvidia-h200", "trial": 17},
    )


@pytest.fixture(autouse=True)
def same_process_after():
    """TrainingArguments writes ACCELERATE_* variables and accelerate's device state: a test that
    builds one (as a user would) must not make later tests' Trainers compile or pick a device."""
    from accelerate.state import PartialState

    environ = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(environ)
    PartialState._reset_state()


def training_arguments(**kwargs):
    with tempfile.TemporaryDirectory() as out:
        return transformers.TrainingArguments(output_dir=out, **kwargs)


# --- Hugging Face ------------------------------------------------------------------------------------


def test_a_tuned_recipe_in_the_installed_transformers_names():
    args = hf.training_arguments(make_recipe(**TUNED))
    assert args == {
        "per_device_train_batch_size": 16,  # 16384 // 1024
        "dataloader_num_workers": 4,
        "dataloader_pin_memory": True,
        "dataloader_persistent_workers": True,
        "bf16": True,
        "fp16": False,
        "dataloader_prefetch_factor": 2,
        "torch_compile": True,
        "torch_compile_mode": "max-autotune-no-cudagraphs",
        **(
            {
                "activation_checkpointing": True,  # 5.x; gradient_checkpointing is its deprecated alias
                "activation_checkpointing_kwargs": {"use_reentrant": False},
                "train_sampling_strategy": "group_by_length",  # 5.x dropped group_by_length
            }
            if five()
            else {
                "gradient_checkpointing": True,
                "gradient_checkpointing_kwargs": {"use_reentrant": False},
                "group_by_length": True,
            }
        ),
    }


@pytest.mark.parametrize(
    "kind,knobs",
    [
        ("cpu", dict(amp_dtype="bfloat16", token_budget=4096)),  # bf16 on a CPU: needs use_cpu
        ("cpu", dict(amp_dtype="float32", batching="packed", checkpoint_layers=(1,))),
        ("cuda", dict(amp_dtype="float16", num_workers=2, compile_mode="default", batching="fixed")),
    ],
)
def test_training_arguments_accept_the_export(kind, knobs):
    exported = hf.training_arguments(make_recipe(kind, **knobs))
    args = training_arguments(**exported)
    assert args.per_device_train_batch_size == exported["per_device_train_batch_size"]
    assert args.use_cpu is (kind == "cpu")
    assert (args.bf16, args.fp16) == (knobs["amp_dtype"] == "bfloat16", knobs["amp_dtype"] == "float16")


def test_model_applied_leaves_checkpointing_and_compile_to_the_model():
    args = hf.training_arguments(make_recipe(**TUNED), model_applied=True)
    assert not {"torch_compile", "torch_compile_mode", "activation_checkpointing", "gradient_checkpointing"} & set(args)
    assert args["bf16"] and (
        args["train_sampling_strategy"] == "group_by_length" if five() else args["group_by_length"]
    )


def test_a_gpu_recipe_is_checked_here_without_the_gpu():
    """bf16 without use_cpu and tf32 need the GPU: those checks are skipped and said to be."""
    note = hf.check_training_arguments(hf.training_arguments(make_recipe(**TUNED), check=False))
    expected = "checked: transformers {} accepts these TrainingArguments".format(transformers_version())
    assert note.startswith(expected)
    if not torch.cuda.is_available():
        assert note.endswith("; GPU-only checks skipped (no CUDA here)")
        tf32 = hf.training_arguments(make_recipe(amp_dtype="tf32"), check=False)
        assert tf32["tf32"] is True
        assert hf.check_training_arguments(tf32).endswith("; tf32 not checked (no CUDA here)")
    else:  # on a GPU machine every check runs, none is said to be skipped
        assert "skipped" not in note and "not checked" not in note


def test_checking_leaves_the_process_as_it_found_it():
    """TrainingArguments(torch_compile=True) writes ACCELERATE_DYNAMO_BACKEND (4.57), after which
    accelerate compiles every Trainer's model in the process, and sets up accelerate's device
    state: the check must leave neither behind for the user's own TrainingArguments."""
    from accelerate.state import PartialState

    PartialState._reset_state()
    environ = dict(os.environ)
    hf.training_arguments(make_recipe("cpu", compile_mode="default", amp_dtype="bfloat16", checkpoint_layers=(0,)))
    assert dict(os.environ) == environ
    assert not PartialState._shared_state


def test_what_transformers_refuses_is_an_error_before_printing():
    version = transformers_version()
    with pytest.raises(AutotuneError, match=f"transformers {version} has no TrainingArguments field 'nonsense'"):
        hf.check_training_arguments({"nonsense": True})
    with pytest.raises(AutotuneError, match=f"transformers {version} refuses these TrainingArguments: .*prefetch"):
        hf.check_training_arguments({"dataloader_prefetch_factor": 2, "dataloader_num_workers": 0})


def test_field_names_follow_the_version():
    new = hf.Names.for_fields(None)  # not installed: 5.x
    assert (new.group_by_length, new.checkpointing) == (
        ("train_sampling_strategy", "group_by_length"),
        "activation_checkpointing",
    )
    old = hf.Names.for_fields({"group_by_length", "gradient_checkpointing", "gradient_checkpointing_kwargs"})  # 4.x
    assert old.group_by_length == ("group_by_length", True)
    assert (old.checkpointing, old.checkpointing_kwargs) == ("gradient_checkpointing", "gradient_checkpointing_kwargs")


def test_the_data_collator_pads_for_hf_models():
    collate = hf.data_collator(seq_len=64)
    batch = collate([{"input_ids": [5, 6, 7]}, [8, 9]])
    assert batch["input_ids"].tolist() == [[5, 6, 7] + [0] * 13, [8, 9] + [0] * 14]
    assert batch["labels"].tolist() == [[5, 6, 7] + [-100] * 13, [8, 9] + [-100] * 14]


# --- Lightning -------------------------------------------------------------------------------------


def test_lightning_trainer_and_dataloader_accept_the_export():
    pl = pytest.importorskip("lightning")
    recipe = make_recipe(**TUNED)
    kwargs = lightning.trainer_kwargs(recipe)
    assert kwargs == {"precision": "bf16-mixed"}
    trainer = pl.Trainer(**kwargs, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    assert trainer.precision == "bf16-mixed"
    loader = lightning.dataloader_kwargs(recipe)
    assert loader == {
        "batch_size": 16,
        "num_workers": 4,
        "pin_memory": True,
        "prefetch_factor": 2,
        "persistent_workers": True,
    }
    torch.utils.data.DataLoader(list(range(4)), **loader)
    for amp, precision in (("float16", "16-mixed"), ("float32", "32-true"), ("tf32", "32-true")):
        assert lightning.trainer_kwargs(make_recipe(amp_dtype=amp)) == {"precision": precision}


def test_what_lightning_refuses_is_an_error():
    pytest.importorskip("lightning")
    with pytest.raises(AutotuneError, match=r"Lightning 2\.\d+\.\d+ refuses these Trainer arguments: .*bf17"):
        lightning.check_trainer_kwargs({"precision": "bf17"})


# --- export on the command line ------------------------------------------------------------------------


def test_export_hf_json_loads_into_training_arguments(tmp_path):
    path = make_recipe("cpu", amp_dtype="bfloat16", checkpoint_layers=(0,)).save(tmp_path / "r.json")
    result = CliRunner().invoke(main, ["export", str(path), "--format", "hf-json"])
    assert result.exit_code == 0, result.output
    args = training_arguments(**json.loads(result.stdout))
    assert args.bf16 and args.use_cpu and (args.activation_checkpointing if five() else args.gradient_checkpointing)


def test_export_lightning_json(tmp_path):
    pytest.importorskip("lightning")
    path = make_recipe(**TUNED).save(tmp_path / "r.json")
    result = CliRunner().invoke(main, ["export", str(path), "--format", "lightning-json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {
        "trainer": {"precision": "bf16-mixed"},
        "dataloader": lightning.dataloader_kwargs(make_recipe(**TUNED)),
        "environment": make_recipe(**TUNED).environment(),  # what to set before CUDA starts (issue 16)
    }


def test_the_python_snippets_say_what_checked_them():
    """What is in the snippets is tested in tests/recipe/test_export.py; here, the line saying
    which installed version's names they are and that it accepts them."""
    text = render(make_recipe(**TUNED), "hf")
    expected = f"# field names of transformers {transformers_version()} (installed); checked: transformers "
    assert expected + f"{transformers_version()} accepts these TrainingArguments" in text
    unstable = make_recipe(**TUNED)
    unstable.measured["unstable"] = True
    assert "# UNSTABLE: its step times varied" in render(unstable, "hf")
    pl = pytest.importorskip("lightning")
    text = render(make_recipe(**TUNED), "lightning")
    assert f"# Lightning {pl.__version__} (installed); checked: Lightning {pl.__version__} accepts these" in text
