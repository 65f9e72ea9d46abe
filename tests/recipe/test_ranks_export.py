"""`autotune export` of a recipe of several ranks, built by the real libraries: Hugging Face
`TrainingArguments` (ddp_* fields, FSDP2's fsdp and fsdp_config) down to the DDP keywords
Trainer hands accelerate; Lightning's `DDPStrategy` or, for FSDP2, `ModelParallelStrategy`
(Lightning's FSDPStrategy is FSDP1), with devices=N, in a Trainer; and the torchrun launch
(`--format torchrun`), run by a shell."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import tempfile

import pytest
from click.testing import CliRunner

from autotune.cli import main
from autotune.config import TrainConfig
from autotune.errors import AutotuneError
from autotune.integrations import hf, lightning
from autotune.integrations.export import render
from autotune.recipe import Recipe
from tests.helpers import HF, lazy

pytestmark = HF  # Lightning and transformers' Trainer share one xdist worker, which imports them once
transformers = lazy("transformers")
QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)


def ranks_recipe(world_size: int = 2, global_batch_tokens: int | None = None, **knobs) -> Recipe:
    return Recipe(
        config=TrainConfig(**{"token_budget": 8192, "amp_dtype": "bfloat16", **knobs}),
        model={"name": "gpt2", "seq_len": 1024, "n_layer": 12},
        measured={"tokens_per_sec": 900000.0},
        hardware={"kind": "cuda", "name": "NVIDIA H200"},
        study={"name": "gpt2-ranks", "trial": 4},
        global_batch_tokens=global_batch_tokens,
        world_size=world_size,
    )


DDP = dict(parallelism="ddp", bucket_cap_mb=100, gradient_as_bucket_view=True, static_graph=True)
FSDP2 = dict(parallelism="fsdp2", reshard_after_forward=False, reduce_dtype="bfloat16")


@pytest.fixture(autouse=True)
def same_process_after():
    """TrainingArguments writes ACCELERATE_* variables and accelerate's device state: later tests
    must not inherit them."""
    from accelerate.state import PartialState

    environ = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(environ)
    PartialState._reset_state()


def built_training_arguments(args: dict):
    # use_cpu: this machine has no GPU (the export's own check adds it too)
    return transformers.TrainingArguments(output_dir=tempfile.mkdtemp(), use_cpu=True, report_to=[], **args)


# --- Hugging Face ------------------------------------------------------------------------------------


def test_a_ddp_recipe_reaches_the_ddp_keywords_trainer_gives_accelerate():
    from autotune.model.load import build_model

    recipe = ranks_recipe(**DDP)
    args = hf.training_arguments(recipe)
    assert {k: args[k] for k in ("ddp_bucket_cap_mb", "ddp_find_unused_parameters", "ddp_static_graph")} == {
        "ddp_bucket_cap_mb": 100,
        "ddp_find_unused_parameters": False,
        "ddp_static_graph": True,
    }
    trainer = transformers.Trainer(model=build_model("hf:gpt2-tiny"), args=built_training_arguments(args))
    handler = trainer.accelerator.ddp_handler  # what accelerate wraps DistributedDataParallel with
    assert (handler.bucket_cap_mb, handler.find_unused_parameters, handler.static_graph) == (100, False, True)
    notes = hf.notes(recipe, args)
    assert any("gradient_as_bucket_view=true, which TrainingArguments has no field for" in n for n in notes)
    assert any("launch the script with torchrun --standalone --nproc-per-node 2" in n for n in notes)
    # a knob of one rank reads as before: no ddp_* field
    assert not any(k.startswith(("ddp_", "fsdp")) for k in hf.training_arguments(ranks_recipe(1)))


def test_an_fsdp2_recipe_is_fsdp_version_2_with_its_reshard_after_forward():
    recipe = ranks_recipe(**FSDP2)
    args = hf.training_arguments(recipe)
    assert args["fsdp"] is True
    assert args["fsdp_config"] == {"version": 2, "reshard_after_forward": False}  # as given, after the check
    plugin = built_training_arguments(args).fsdp_plugin_args  # what transformers hands accelerate's FSDP plugin
    assert plugin["fsdp_version"] == 2 and plugin["reshard_after_forward"] is False
    notes = hf.notes(recipe, args)
    assert any("reduce-scatters FSDP2's gradients in bfloat16" in n and "no field for" in n for n in notes)


def test_the_global_batch_of_several_ranks_is_per_rank_accumulation():
    recipe = ranks_recipe(4, global_batch_tokens=8192 * 4 * 2, parallelism="ddp")
    args = hf.training_arguments(recipe)
    assert args["gradient_accumulation_steps"] == 2
    assert any(
        "2 micro-batches of 8192 (gradient_accumulation_steps) on each of its 4 ranks" in n
        for n in hf.notes(recipe, args)
    )


# --- Lightning -------------------------------------------------------------------------------------


def test_a_ddp_recipe_is_a_ddp_strategy_on_n_devices_in_a_real_trainer():
    pl = pytest.importorskip("lightning")
    from lightning.pytorch.strategies import DDPStrategy

    kwargs = lightning.trainer_kwargs(ranks_recipe(**DDP))
    strategy = kwargs["strategy"]
    assert isinstance(strategy, DDPStrategy) and kwargs["devices"] == 2
    assert strategy._ddp_kwargs == {"bucket_cap_mb": 100, "gradient_as_bucket_view": True, "static_graph": True}
    trainer = pl.Trainer(**kwargs, **QUIET)
    assert trainer.strategy is strategy and trainer.num_devices == 2


def test_an_fsdp2_recipe_is_a_model_parallel_strategy_of_n_data_parallel_ranks():
    pl = pytest.importorskip("lightning")
    from lightning.pytorch.strategies import ModelParallelStrategy

    recipe = ranks_recipe(**FSDP2)
    kwargs = lightning.trainer_kwargs(recipe)
    assert isinstance(kwargs["strategy"], ModelParallelStrategy) and kwargs["devices"] == 2
    trainer = pl.Trainer(**kwargs, **QUIET)
    assert (trainer.strategy._data_parallel_size, trainer.strategy._tensor_parallel_size) == (2, 1)
    notes = lightning.notes(recipe)
    assert any("FSDPStrategy shards with FSDP1" in n and "configure_model" in n for n in notes)
    assert any("use_distributed_sampler=False" in n for n in notes)


def test_a_ddp_keyword_distributed_data_parallel_does_not_take_is_refused():
    pytest.importorskip("lightning")
    spec = {"class_path": "lightning.pytorch.strategies.DDPStrategy", "init_args": {"bucket_cap": 100}}
    with pytest.raises(AutotuneError, match="DistributedDataParallel refuses DDPStrategy's keywords"):
        lightning.check_trainer_kwargs({"devices": 2, "strategy": spec})


# --- export: the snippets run, the JSON builds, the launch -----------------------------------------


def test_the_printed_python_builds_what_it_says():
    pl = pytest.importorskip("lightning")
    ns: dict = {}
    exec(compile(render(ranks_recipe(**DDP), "lightning"), "lightning", "exec"), ns)
    trainer = pl.Trainer(**ns["trainer_kwargs"], strategy=ns["strategy"], **QUIET)
    assert trainer.strategy._ddp_kwargs["bucket_cap_mb"] == 100 and trainer.num_devices == 2
    ns = {}
    text = render(ranks_recipe(**FSDP2), "hf")
    exec(compile(text, "hf", "exec"), ns)
    assert built_training_arguments(ns["training_args"]).fsdp_plugin_args["reshard_after_forward"] is False
    ast.parse(render(ranks_recipe(**FSDP2), "lightning"))


def test_lightning_json_writes_the_strategy_as_lightning_cli_does(tmp_path):
    pytest.importorskip("lightning")
    from lightning.pytorch.strategies import DDPStrategy

    path = ranks_recipe(**DDP).save(tmp_path / "r.json")
    result = CliRunner().invoke(main, ["export", str(path), "--format", "lightning-json"])
    assert result.exit_code == 0, result.output
    trainer = json.loads(result.stdout)["trainer"]
    assert trainer["devices"] == 2 and trainer["strategy"] == {
        "class_path": "lightning.pytorch.strategies.DDPStrategy",
        "init_args": {"bucket_cap_mb": 100, "gradient_as_bucket_view": True, "static_graph": True},
    }
    assert isinstance(lightning.build_strategy(trainer["strategy"]), DDPStrategy)


def launched(text: str, tmp_path, cores: int) -> str:
    """`text` run by sh, with `torchrun` and `nproc` that say what they were given."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "torchrun").write_text(
        '#!/bin/sh\necho "torchrun $*"\necho "OMP_NUM_THREADS=$OMP_NUM_THREADS"\n'
        'echo "PYTORCH_CUDA_ALLOC_CONF=$PYTORCH_CUDA_ALLOC_CONF"\n'
    )
    (bin_dir / "nproc").write_text(f"#!/bin/sh\necho {cores}\n")
    for tool in ("torchrun", "nproc"):
        (bin_dir / tool).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    env.pop("OMP_NUM_THREADS", None)
    done = subprocess.run(["sh", "-c", text], capture_output=True, text=True, env=env, timeout=60, check=True)
    return done.stdout


def test_export_torchrun_launches_n_ranks_with_their_threads_and_environment(tmp_path):
    path = ranks_recipe(4, parallelism="ddp", num_workers=2, prefetch_factor=2).save(tmp_path / "r.json")
    result = CliRunner().invoke(main, ["export", str(path), "--format", "torchrun"])
    assert result.exit_code == 0, result.output
    assert "torchrun --standalone --nproc-per-node 4 train.py" in result.stdout
    said = launched(result.stdout, tmp_path, cores=16).splitlines()
    # 16 cores, 4 ranks: 4 each, less 2 DataLoader workers per rank
    assert said == [
        "torchrun --standalone --nproc-per-node 4 train.py",
        "OMP_NUM_THREADS=2",
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False",
    ]
    assert launched(result.stdout, tmp_path, cores=2).splitlines()[1] == "OMP_NUM_THREADS=1"  # never 0


def test_export_torchrun_of_one_rank_says_it_is_a_single_process_recipe(tmp_path):
    path = ranks_recipe(1).save(tmp_path / "r.json")
    result = CliRunner().invoke(main, ["export", str(path), "--format", "torchrun"])
    assert result.exit_code == 0, result.output
    assert "is a single-process recipe (measured on one rank, parallelism=none)" in result.stdout
    assert "torchrun --" not in result.stdout
