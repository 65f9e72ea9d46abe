"""A recipe of several ranks (issue C, item 4): the world size it was measured with, recorded in
its `batch` section beside the parallelism knobs of its config; read back the same from JSON
and YAML; absent (1) from a one-process recipe, which reads as it always has; and refused in one
line when it disagrees with the parallelism."""

from __future__ import annotations

import json

import optuna
import pytest
import yaml

from autotune.config import TrainConfig
from autotune.errors import UsageError
from autotune.recipe import Recipe
from autotune.recipe.from_study import recipe_from_trial
from autotune.study.summary import summarize

DDP = TrainConfig(parallelism="ddp", bucket_cap_mb=100, gradient_as_bucket_view=True)  # static_graph: see the last test
FSDP2 = TrainConfig(parallelism="fsdp2", reshard_after_forward=False)


def ranks_recipe(config: TrainConfig = DDP, world_size: int = 4, global_batch_tokens: int | None = 8192 * 64):
    return Recipe(
        config=config.replace(token_budget=8192),
        model={"name": "gpt2", "seq_len": 1024, "n_layer": 12},
        measured={"tokens_per_sec": 1_000_000.0},
        hardware={"kind": "cuda", "name": "NVIDIA H200"},
        global_batch_tokens=global_batch_tokens,
        world_size=world_size,
    )


@pytest.mark.parametrize("config", [DDP, FSDP2], ids=["ddp", "fsdp2"])
def test_a_recipe_of_several_ranks_records_its_world_size_and_reads_back_the_same(config, tmp_path):
    recipe = ranks_recipe(config)
    # the global batch is across the ranks: 8192 tokens x 16 micro-batches x 4 ranks
    assert recipe.accumulation_steps == 16
    data = recipe.to_dict()
    assert data["batch"] == {
        "micro_batch_tokens": 8192,
        "accumulation_steps": 16,
        "world_size": 4,
        "global_batch_tokens": 524288,
    }
    assert data["config"]["parallelism"] == config.parallelism
    assert Recipe.load(recipe.save(tmp_path / "r.json"), check_environment=False) == recipe
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    assert Recipe.load(tmp_path / "r.yaml", check_environment=False) == recipe
    # one process: no world_size anywhere, the batch section as it always was
    one = Recipe(config=TrainConfig(token_budget=8192), global_batch_tokens=524288)
    assert one.world_size == 1 and one.accumulation_steps == 64
    assert one.to_dict()["batch"] == {
        "micro_batch_tokens": 8192,
        "accumulation_steps": 64,
        "global_batch_tokens": 524288,
    }
    assert "world_size" not in json.dumps(one.to_dict())


def test_a_recipe_written_before_ranks_reads_as_one_process():
    data = Recipe(config=TrainConfig(token_budget=8192), global_batch_tokens=8192 * 4).to_dict()
    assert Recipe.from_dict(data).world_size == 1
    del data["batch"]
    assert Recipe.from_dict(data).world_size == 1


@pytest.mark.parametrize(
    "parallelism, world_size, message",
    [
        ("none", 2, "world_size 2 and parallelism=none disagree: 2 ranks with parallelism=none would train 2 "),
        ("ddp", 1, "world_size 1 and parallelism=ddp disagree: parallelism=ddp needs more than one rank"),
        ("fsdp2", None, "world_size 1 and parallelism=fsdp2 disagree"),
    ],
)
def test_a_world_size_that_disagrees_with_the_parallelism_is_refused_at_load_in_one_line(
    parallelism, world_size, message, tmp_path
):
    data = ranks_recipe(TrainConfig(parallelism="ddp")).to_dict()
    data["config"] = TrainConfig(parallelism=parallelism, token_budget=8192).to_dict()
    data["batch"] = {"micro_batch_tokens": 8192, "world_size": world_size, "global_batch_tokens": None}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    with pytest.raises(UsageError, match=message) as refused:
        Recipe.load(path, check_environment=False)
    assert "\n" not in str(refused.value) and str(refused.value).startswith(f"recipe {path}: ")
    with pytest.raises(UsageError, match="disagree"):  # built in Python, the same rule
        Recipe(config=TrainConfig(parallelism=parallelism), world_size=world_size or 1)


@pytest.mark.parametrize(
    "batch, message",
    [
        ({"world_size": 0}, r"world_size: expected a whole number from 1 to 256"),
        ({"world_size": True}, r"world_size: expected a whole number"),
        ({"world_size": "4"}, r"world_size: expected a whole number"),
        ({"accumulation_steps": 64, "world_size": 4}, "64 micro-batches of 8192 tokens on each of 4 ranks are not"),
        ({"world_size": 3}, "8192 on each of 3 ranks does not divide the global batch of 524288"),
    ],
)
def test_a_batch_section_whose_ranks_do_not_add_up_is_refused(batch, message):
    data = ranks_recipe().to_dict()
    data["batch"] = {"micro_batch_tokens": 8192, "global_batch_tokens": 524288, **batch}
    with pytest.raises(UsageError, match=message):
        Recipe.from_dict(data)


def test_the_recipe_of_a_study_of_several_ranks_records_them():
    study = optuna.create_study(direction="maximize")
    study.set_user_attr("model", "gpt2-tiny")
    study.set_user_attr("hardware", {"kind": "cpu", "name": "a CPU"})
    study.set_user_attr("run", {"model": "gpt2-tiny", "nproc_per_node": 2, "global_batch_tokens": 4096})
    cfg = TrainConfig(parallelism="ddp", token_budget=1024).to_dict()
    study.add_trial(
        optuna.trial.create_trial(
            value=1000.0,
            user_attrs={
                "outcome": "ok",
                "config": cfg,
                "tokens_per_sec": 1000.0,
                "peak_memory_bytes": 10**6,
                "measurement": {"config": cfg, "outcome": "ok", "tokens_per_sec": 1000.0, "peak_memory_bytes": 10**6},
            },
        )
    )
    recipe = recipe_from_trial(summarize(study), "s", "sqlite://")
    assert recipe.world_size == 2 and recipe.accumulation_steps == 2
    assert recipe.to_dict()["batch"]["world_size"] == 2


def test_static_graph_cannot_accumulate_so_a_search_prunes_it_and_a_recipe_with_it_is_refused(tmp_path):
    """DDP's static_graph fails its first backward under no_sync (pytorch#143580; the crash is
    seen with two real ranks in test_ranks_training): a trial that would accumulate with it is
    UnsupportedConfig, and a recipe that says so is refused at load."""
    from autotune.config import accumulation_for
    from autotune.errors import UnsupportedConfig

    static = TrainConfig(parallelism="ddp", static_graph=True, token_budget=8192)
    with pytest.raises(UnsupportedConfig, match=r"static_graph=true cannot accumulate 2 micro-batches"):
        accumulation_for(8192 * 4, static, world_size=2)
    assert accumulation_for(8192 * 2, static, world_size=2) == 1  # no accumulation: it runs
    recipe = Recipe(config=static, world_size=2, global_batch_tokens=8192 * 2)
    data = recipe.to_dict()
    data["batch"] = {"micro_batch_tokens": 8192, "world_size": 2, "global_batch_tokens": 8192 * 4}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    with pytest.raises(UsageError) as refused:
        Recipe.load(path, check_environment=False)
    assert str(refused.value).startswith(
        f"recipe {path}: static_graph=true with 2 micro-batches: static_graph=true cannot accumulate"
    )
    with pytest.raises(UsageError, match="pytorch#143580"):
        Recipe(config=static, world_size=2, global_batch_tokens=8192 * 4)
