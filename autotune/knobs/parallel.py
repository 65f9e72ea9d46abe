"""The ranks of one launch training one model: knob `parallelism` and DDP's and FSDP2's own.

    none    one process; nothing is wrapped (several ranks with it are refused: they would train
            unsynchronised replicas, `registry._parallelism_run_rule`)
    ddp     `DistributedDataParallel` over the whole model: every rank holds every parameter,
            gradients are all-reduced in buckets of `bucket_cap_mb` MiB as backward produces
            them (`gradient_as_bucket_view`, `static_graph` as DDP documents them)
    fsdp2   `torch.distributed.fsdp.fully_shard` on each transformer block, then on the root
            (the embedding, the head and whatever else is left): each rank holds a shard of each
            parameter, gathered for a block's forward and backward (`reshard_after_forward`: freed
            again between them), gradients reduce-scattered in `reduce_dtype`

The order, torchtitan's: activation checkpointing (20), then compile per block (90), then this
(95): each block's FSDP2 hooks and DDP's buckets sit outside the compiled code, and the first
compiled call runs inside DDP's forward, where dynamo's DDPOptimizer finds the buckets to split
its graphs at (so `bucket_cap_mb` also sets the graph breaks under compile).

A process group must be initialised (torchrun, then `torch.distributed.init_process_group`)
with the world size the caller expects (the trial's ranks, the recipe's): else UsageError, before
anything is wrapped. `GradientSync` is what accumulation needs: no gradient communication but
on the last micro-batch of an optimizer step."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.nn as nn

from autotune.config import TrainConfig
from autotune.errors import UnsupportedConfig, UsageError
from autotune.model.introspect import find_blocks

REDUCE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def apply_parallel_knob(model: nn.Module, cfg: TrainConfig, where: Any) -> nn.Module:
    """The model stage's hook for `parallelism` (and DDP's and FSDP2's knobs): the model wrapped in
    DDP, or sharded with FSDP2, over the initialised process group; the model itself for none.
    `where.world_size` is the number of ranks the caller expects."""
    expected = getattr(where, "world_size", 1)
    if cfg.parallelism == "none":
        if expected > 1:
            raise UsageError(
                f"{expected} ranks with parallelism=none would train unsynchronised replicas: use ddp or fsdp2"
            )
        return model
    ranks = process_group_size(cfg.parallelism)
    if ranks != expected:
        raise UsageError(
            f"parallelism={cfg.parallelism} for {expected} rank{'s' if expected != 1 else ''}, but the process "
            f"group has {ranks}: launch with torchrun --nproc-per-node {expected}"
        )
    if cfg.parallelism == "ddp":
        return wrap_ddp(model, cfg)
    return shard_fsdp2(model, cfg, getattr(where, "block_path", None))


def process_group_size(mode: str) -> int:
    """The world size of the initialised default process group; UsageError when there is none."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise UsageError(
            f"parallelism={mode} needs an initialised process group: launch with torchrun --nproc-per-node N and "
            "call torch.distributed.init_process_group() before applying the configuration"
        )
    return dist.get_world_size()


def wrap_ddp(model: nn.Module, cfg: TrainConfig) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    param = next(model.parameters(), None)
    device_ids = [param.device.index] if param is not None and param.device.type == "cuda" else None
    return DistributedDataParallel(
        model,
        device_ids=device_ids,
        bucket_cap_mb=cfg.bucket_cap_mb,
        gradient_as_bucket_view=cfg.gradient_as_bucket_view,
        static_graph=cfg.static_graph,
    )


def shard_fsdp2(model: nn.Module, cfg: TrainConfig, block_path: str | None = None) -> nn.Module:
    """fully_shard on each block, then on the root, in place (the model keeps its class and its
    state_dict keys; its parameters become DTensor shards)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(reduce_dtype=REDUCE_DTYPES[cfg.reduce_dtype])
    sharded = []
    for block in find_blocks(model, block_path):
        sharded.append(fully_shard(block, reshard_after_forward=cfg.reshard_after_forward, mp_policy=policy))
    sharded.append(fully_shard(model, reshard_after_forward=cfg.reshard_after_forward, mp_policy=policy))
    if _backend() == "gloo":
        # pytorch#162338 (open): FSDP2's reduce-scatter with ReduceOp.AVG on gloo summed the
        # gradients, N times too large. Sums only, then FSDP2's own division by the world size,
        # gives the mean on any gloo (tests/trial/test_parity.py holds it to a single process's).
        for module in sharded:
            if not hasattr(module, "set_force_sum_reduction_for_comms"):
                raise UnsupportedConfig(
                    "parallelism",
                    "fsdp2 on gloo needs torch >= 2.8 (set_force_sum_reduction_for_comms): its average "
                    "reduce-scatter sums on gloo (pytorch#162338)",
                )
            module.set_force_sum_reduction_for_comms(True)
    return model


def _backend() -> str:
    import torch.distributed as dist

    return str(dist.get_backend())


def is_ddp(model: nn.Module) -> bool:
    from torch.nn.parallel import DistributedDataParallel

    return isinstance(model, DistributedDataParallel)


def is_fsdp2(model: nn.Module) -> bool:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch built without distributed
        return False
    return isinstance(model, FSDPModule)


class GradientSync:
    """`with sync(last):` around a micro-batch's forward and backward: gradients are communicated
    only when `last` (the last micro-batch of an optimizer step). DDP: `no_sync()` otherwise (its
    forward must be inside too: it prepares the reduction there); FSDP2:
    `set_requires_gradient_sync(False)` otherwise, the gradients kept unsharded and accumulated
    locally until the step's last backward reduce-scatters their sum. A model that is neither:
    nothing to skip, nothing done."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.kind = "ddp" if is_ddp(model) else "fsdp2" if is_fsdp2(model) else None
        self._fsdp_sync = True  # FSDP2's flag as last set (its default)

    def __call__(self, last: bool) -> contextlib.AbstractContextManager[None]:
        if self.kind == "ddp":
            return contextlib.nullcontext() if last else self.model.no_sync()
        if self.kind == "fsdp2" and last != self._fsdp_sync:
            self.model.set_requires_gradient_sync(last)  # recurses into every sharded block
            self._fsdp_sync = last
        return contextlib.nullcontext()
