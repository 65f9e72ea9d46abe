"""The multi-rank knobs (`parallelism` and DDP's and FSDP2's own) as values and as a wrap: their
rules with the others and with the run's ranks, a single-process recipe that reads as it always
has, and `knobs.parallel.apply_parallel_knob` over a real (one-rank, in-process gloo) group."""

from __future__ import annotations

import json

import pytest
import torch

from autotune import registry
from autotune.config import RunSpec, TrainConfig, accumulation_for, accumulation_steps, parse_assignments
from autotune.errors import UnsupportedConfig, UsageError
from autotune.knobs.apply import Where, apply_model_knobs
from autotune.knobs.parallel import apply_parallel_knob
from autotune.model.load import build_model
from autotune.recipe import Recipe

RANK_KNOBS = ("parallelism", "bucket_cap_mb", "gradient_as_bucket_view", "static_graph", "reshard_after_forward")


def test_the_knobs_and_their_defaults():
    cfg = TrainConfig()
    assert (cfg.parallelism, cfg.bucket_cap_mb, cfg.gradient_as_bucket_view, cfg.static_graph) == (
        "none",
        25,
        False,
        False,
    )
    assert (cfg.reshard_after_forward, cfg.reduce_dtype) == (True, "float32")
    assert registry.knob("parallelism").choices == ("none", "ddp", "fsdp2")
    assert all(registry.knob(name).ranks_only for name in (*RANK_KNOBS, "reduce_dtype"))


@pytest.mark.parametrize(
    "values, knob",
    [
        ({"bucket_cap_mb": 100}, "bucket_cap_mb"),
        ({"parallelism": "fsdp2", "static_graph": True}, "static_graph"),
        ({"parallelism": "ddp", "reshard_after_forward": False}, "reshard_after_forward"),
        ({"parallelism": "ddp", "reduce_dtype": "bfloat16"}, "reduce_dtype"),
    ],
)
def test_a_knob_of_one_parallelism_is_refused_under_another(values, knob):
    with pytest.raises(UsageError, match=f"{knob} is a setting of"):
        TrainConfig(**values)


def test_an_inactive_knob_goes_back_to_its_default_as_prefetch_does():
    ddp = TrainConfig(parallelism="ddp", bucket_cap_mb=100, static_graph=True)
    assert ddp.with_overrides(parse_assignments(["parallelism=fsdp2"])).to_dict() == {
        **TrainConfig(parallelism="fsdp2").to_dict()
    }
    with pytest.raises(UsageError, match="bucket_cap_mb is a setting of ddp"):
        ddp.with_overrides(parse_assignments(["parallelism=none", "bucket_cap_mb=50"]))


def test_the_ranks_decide_which_parallelism_can_run():
    with pytest.raises(UnsupportedConfig, match="unsynchronised replicas"):
        accumulation_for(None, TrainConfig(), world_size=2)
    with pytest.raises(UnsupportedConfig, match="parallelism=ddp needs more than one rank"):
        accumulation_for(None, TrainConfig(parallelism="ddp"))
    assert accumulation_for(None, TrainConfig(parallelism="fsdp2"), world_size=2) == 1
    assert RunSpec(nproc_per_node=2).accumulation_steps(TrainConfig(parallelism="ddp")) == 1


def test_the_global_batch_is_across_the_ranks():
    # micro-batch x accumulation x ranks
    assert accumulation_steps(8192, 1024, 2) == 4
    assert accumulation_steps(8192, 1024) == 8
    with pytest.raises(UnsupportedConfig, match="1024 on each of 3 ranks does not divide"):
        accumulation_steps(8192, 1024, 3)
    with pytest.raises(UnsupportedConfig, match="more than the global batch"):
        accumulation_steps(1024, 1024, 2)


def test_a_single_process_run_and_recipe_read_as_they_always_have():
    assert "nproc_per_node" not in RunSpec().to_dict()
    assert RunSpec.from_dict(RunSpec(nproc_per_node=4).to_dict()).nproc_per_node == 4
    recipe = Recipe(config=TrainConfig(), model={"name": "gpt2-tiny"}, hardware={"kind": "cpu"})
    config = recipe.to_dict()["config"]
    assert not set(config) & {k.name for k in registry.knobs_of() if k.ranks_only}
    assert list(config) == [k.name for k in registry.knobs_of() if not k.ranks_only]
    back = Recipe.from_dict(json.loads(json.dumps(recipe.to_dict())))
    assert back.config == TrainConfig()
    ddp = Recipe(config=TrainConfig(parallelism="ddp", bucket_cap_mb=100), model={"name": "gpt2-tiny"}, world_size=2)
    saved = ddp.to_dict()["config"]
    assert saved["parallelism"] == "ddp" and saved["bucket_cap_mb"] == 100 and "reduce_dtype" in saved
    assert Recipe.from_dict(json.loads(json.dumps(ddp.to_dict()))).config == ddp.config


def test_wrapping_without_a_process_group_is_refused_clearly():
    model = build_model("gpt2-tiny")
    with pytest.raises(UsageError, match="needs an initialised process group: launch with torchrun"):
        apply_parallel_knob(model, TrainConfig(parallelism="ddp"), Where(None, "cpu", 2))
    with pytest.raises(UsageError, match="unsynchronised replicas"):
        apply_parallel_knob(model, TrainConfig(), Where(None, "cpu", 2))
    assert apply_parallel_knob(model, TrainConfig(), Where(None, "cpu")) is model


def test_ddp_wraps_with_its_knobs_and_a_world_size_that_differs_is_refused(one_rank_group):
    from torch.nn.parallel import DistributedDataParallel

    cfg = TrainConfig(parallelism="ddp", bucket_cap_mb=100, gradient_as_bucket_view=True, static_graph=True)
    with pytest.raises(UsageError, match="for 2 ranks, but the process group has 1"):
        apply_parallel_knob(build_model("gpt2-tiny"), cfg, Where(None, "cpu", 2))
    wrapped = apply_model_knobs(build_model("gpt2-tiny"), cfg, world_size=1)
    assert isinstance(wrapped, DistributedDataParallel)
    assert wrapped.bucket_bytes_cap == 100 * 1024 * 1024
    assert wrapped.gradient_as_bucket_view and wrapped.static_graph


def test_fsdp2_shards_each_block_then_the_root(one_rank_group):
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    cfg = TrainConfig(parallelism="fsdp2", reshard_after_forward=False)
    model = build_model("gpt2-tiny")
    sharded = apply_model_knobs(model, cfg, world_size=1)
    assert sharded is model and isinstance(model, FSDPModule)
    assert all(isinstance(block, FSDPModule) for block in model.transformer.h)
    assert all(isinstance(p, DTensor) for p in model.parameters())
    policy = model._get_fsdp_state()._mp_policy
    assert policy.reduce_dtype == torch.float32


def test_ddp_static_graph_cannot_accumulate():
    # no_sync() under static_graph: DDP's reducer fails an internal assert (pytorch#187732)
    cfg = TrainConfig(parallelism="ddp", static_graph=True, token_budget=1024)
    with pytest.raises(UnsupportedConfig, match="static_graph=true cannot accumulate 2 micro-batches"):
        accumulation_for(4096, cfg, world_size=2)
    assert accumulation_for(2048, cfg, world_size=2) == 1
    assert accumulation_for(4096, cfg.replace(static_graph=False), world_size=2) == 2


def test_float16_under_fsdp2_is_refused_with_its_reason():
    """GradScaler's overflow check reads each rank's own shards: ranks could step differently."""
    from autotune.config import TrainConfig
    from autotune.errors import UsageError

    with pytest.raises(UsageError, match="checks each rank's gradient shards for overflow alone"):
        TrainConfig(amp_dtype="float16", parallelism="fsdp2")
    assert TrainConfig(amp_dtype="float16", parallelism="ddp").parallelism == "ddp"  # DDP's gradients are whole
    assert TrainConfig(amp_dtype="bfloat16", parallelism="fsdp2").parallelism == "fsdp2"
