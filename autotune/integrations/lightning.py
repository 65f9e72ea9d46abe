"""A recipe as Lightning `Trainer` and DataLoader keyword arguments.

Lightning 2.x names precisions "bf16-mixed", "16-mixed" and "32-true" (1.x said "bf16", 16,
32); the names follow the installed version (`lightning` or `pytorch_lightning`), 2.x when
neither is installed. With Lightning installed, `trainer_kwargs` constructs a `Trainer` from
the result before returning it.

    import lightning
    from autotune.integrations import lightning as autotune_lightning
    trainer = lightning.Trainer(max_steps=1000, **autotune_lightning.trainer_kwargs(recipe))
    trainer.fit(module, train_dataloaders=recipe.dataloader(dataset, for_model=module.model))

The recipe's own batches (token budget, length grouping) come from `recipe.dataloader`; for a
DataLoader of your own, `dataloader_kwargs(recipe)` gives its workers, prefetch and pinning.
Checkpointing and compile go in `LightningModule.configure_model`: `recipe.apply_to_model(self.model)`.

A recipe of several ranks adds `devices=N` and its strategy: `DDPStrategy(bucket_cap_mb=...,
gradient_as_bucket_view=..., static_graph=...)` for ddp (configure_model then calls
`apply_to_model(self.model, wrap=False)`: the strategy wraps), or for fsdp2
`ModelParallelStrategy(data_parallel_size=N, tensor_parallel_size=1)`, whose configure_model
`recipe.apply_to_model(self.model)` shards (Lightning's FSDPStrategy is FSDP1). `trainer_kwargs`
builds the strategy with the installed Lightning; `checked_trainer_kwargs` and the JSON export
write it as {"class_path", "init_args"}, LightningCLI's form.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
from typing import Any

from autotune.errors import AutotuneError, UsageError
from autotune.integrations.common import (
    View,
    checkpointed_blocks,
    compiled_scope,
    installed_version,
    knob_fields,
    knob_notes,
    major_minor,
    quietly,
    sequences_per_step,
)
from autotune.recipe.recipe import Recipe

log = logging.getLogger(__name__)


def lightning_version() -> str | None:
    return installed_version("lightning", "pytorch_lightning", "pytorch-lightning")


def trainer_kwargs(recipe: Recipe, *, check: bool = True) -> dict[str, Any]:
    """`Trainer` keyword arguments closest to the recipe: its precision, and
    accumulate_grad_batches when the recipe accumulates to a global batch; for a recipe of
    several ranks, devices and the strategy, built (a Lightning object: Lightning must be
    installed). tf32 has no Trainer argument: call torch.set_float32_matmul_precision("high")
    (see `notes`). check: construct a Trainer from them first (when Lightning is installed)."""
    kwargs = checked_trainer_kwargs(recipe, check=check)[0]
    if isinstance(kwargs.get("strategy"), dict):
        kwargs["strategy"] = build_strategy(kwargs["strategy"])
    return kwargs


def checked_trainer_kwargs(recipe: Recipe, *, check: bool = True) -> tuple[dict[str, Any], str]:
    """`trainer_kwargs`, and one line saying which version's names they are and what checked them."""
    version = lightning_version()
    major = major_minor(version)[0] if version else 2
    kwargs: dict[str, Any] = knob_fields("lightning", View(recipe, major_version=major))
    if recipe.accumulation_steps > 1:  # micro-batches per optimizer step, to the recipe's global batch
        kwargs["accumulate_grad_batches"] = recipe.accumulation_steps
    if version is None:
        return kwargs, "Lightning is not installed here: Lightning 2.x names, not checked"
    said = f"Lightning {version} (installed)"
    return kwargs, (f"{said}; {check_trainer_kwargs(kwargs)}" if check else said)


def dataloader_kwargs(recipe: Recipe, *, seq_len: int | None = None) -> dict[str, Any]:
    """`torch.utils.data.DataLoader` keyword arguments: batch_size token_budget // seq_len
    (yours, else the recipe's), workers, prefetch, pinning, persistent workers (each knob's
    registry entry says its own)."""
    return knob_fields("loader", View(recipe, sequences_per_step=sequences_per_step(recipe, seq_len)))


def check_trainer_kwargs(kwargs: dict[str, Any]) -> str:
    """Construct `Trainer(**kwargs)` with the installed Lightning (no logger, no checkpoint
    callback: nothing is written), its strategy built from its {"class_path", "init_args"};
    return what was checked, in one line. DDPStrategy hands its keywords to
    DistributedDataParallel only when training starts: they are checked against its signature."""
    version = lightning_version()
    if version is None:
        raise UsageError("checking Trainer arguments needs Lightning: pip install lightning")
    try:
        import lightning as pl
    except ImportError:
        import pytorch_lightning as pl  # type: ignore[no-redef]
    quiet = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    spec = kwargs.get("strategy")
    with quietly("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning", "lightning_fabric"):
        try:
            built = {**kwargs, "strategy": build_strategy(spec)} if isinstance(spec, dict) else kwargs
            pl.Trainer(**built, **quiet)
        except AutotuneError:
            raise
        except Exception as exc:  # Lightning raises its own MisconfigurationException, among others
            raise AutotuneError(f"Lightning {version} refuses these Trainer arguments: {exc}") from None
    said = f"checked: Lightning {version} accepts these Trainer arguments"
    if isinstance(spec, dict) and spec["class_path"].endswith(".DDPStrategy"):
        _check_ddp_keywords(spec.get("init_args", {}))
        said += " and DistributedDataParallel its DDPStrategy keywords"
    return said


def build_strategy(spec: dict[str, Any]) -> Any:
    """A Lightning strategy from {"class_path", "init_args"}, with the installed Lightning (its
    `lightning.pytorch` or `pytorch_lightning` package, whichever is installed)."""
    module, _, name = spec["class_path"].rpartition(".")
    for candidate in (module, "lightning.pytorch.strategies", "pytorch_lightning.strategies"):
        try:
            strategies = importlib.import_module(candidate)
        except ImportError:
            continue
        if hasattr(strategies, name):
            return getattr(strategies, name)(**spec.get("init_args", {}))
        raise AutotuneError(f"Lightning {lightning_version()} has no {name} (in {candidate})")
    raise UsageError(f"the recipe's strategy is Lightning's {name}: pip install lightning")


def _check_ddp_keywords(init_args: dict[str, Any]) -> None:
    from torch.nn.parallel import DistributedDataParallel

    try:
        inspect.signature(DistributedDataParallel.__init__).bind(None, None, **init_args)
    except TypeError as exc:
        raise AutotuneError(f"DistributedDataParallel refuses DDPStrategy's keywords: {exc}") from None


def notes(recipe: Recipe) -> list[str]:
    """What Trainer and DataLoader arguments cannot express, one sentence a line: the global
    batch, the recipe's own batches, checkpointing and compile (`apply_to_model` in
    configure_model), then each knob's own (`registry.Knob.lightning_note`)."""
    cfg = recipe.config
    ranks = recipe.world_size
    lines = []
    if recipe.global_batch_tokens is not None and ranks > 1:
        lines.append(
            f"Global batch: {recipe.global_batch_tokens} tokens per optimizer step, {recipe.accumulation_steps} "
            f"micro-batches of {cfg.token_budget} (accumulate_grad_batches) on each of its {ranks} devices."
        )
    elif recipe.global_batch_tokens is not None:
        lines.append(
            f"Global batch: {recipe.global_batch_tokens} tokens per optimizer step, {recipe.accumulation_steps} "
            f"micro-batches of {cfg.token_budget} (accumulate_grad_batches), on one device; with N devices, "
            "divide accumulate_grad_batches by N to keep it."
        )
    if cfg.batching != "fixed":
        lines.append(
            "For the recipe's own batches (token budget, length grouping or packing), pass "
            "recipe.dataloader(dataset, for_model=model) to trainer.fit instead of a DataLoader."
        )
    if ranks > 1:
        lines.append(
            f"recipe.dataloader deals each of the {ranks} ranks its own share of every epoch: with it, give Trainer "
            "use_distributed_sampler=False (Lightning cannot put its sampler in the recipe's batches)."
        )
    done = []
    if cfg.checkpoint_layers:
        done.append(
            f"checkpoints {checkpointed_blocks(recipe)} "
            "(torch.utils.checkpoint.checkpoint of each one's forward, use_reentrant=False)"
        )
    if cfg.compile_mode != "none":
        done.append(f"{'then ' if done else ''}compiles {compiled_scope(recipe)}")
    if done and cfg.parallelism == "ddp":
        lines.append(
            f"The recipe {', '.join(done)}: call recipe.apply_to_model(self.model, wrap=False) in "
            "LightningModule.configure_model, which does exactly that (DDPStrategy wraps the model after it)."
        )
    elif done:
        lines.append(
            f"The recipe {', '.join(done)}: call recipe.apply_to_model(self.model) in "
            "LightningModule.configure_model, which does exactly that."
        )
    return lines + knob_notes("lightning_note", "Lightning", View(recipe))


def RecipeCallback(recipe: Recipe, *, output_dir: str | None = None) -> Any:  # noqa: N802 - reads as the class it makes
    """A Lightning `Callback` that meters the run against `recipe` (`recipe.meter.RunMeter`):
    `lightning.Trainer(..., callbacks=[autotune_lightning.RecipeCallback(recipe)])`. At the end of
    training it logs the one-line verdict and writes the report to autotune_meter.json in the
    trainer's log_dir (else its default_root_dir, or `output_dir`), from global rank zero. The
    class is made on the first call, so importing this module does not import Lightning."""
    return _callback_class()(recipe, output_dir)


@functools.cache
def _callback_class() -> type:
    try:
        from lightning.pytorch import Callback
    except ImportError:
        from pytorch_lightning import Callback  # type: ignore[no-redef]

    from autotune.integrations.common import finish_meter
    from autotune.recipe.meter import RunMeter

    class RecipeCallback(Callback):
        """Lightning's hooks to the meter: train start makes it over the module's model (after
        configure_model applied the recipe), batch start is the batch in hand, batch end the
        step's end, with the batch."""

        def __init__(self, recipe: Recipe, output_dir: str | None) -> None:
            self.recipe, self.output_dir = recipe, output_dir
            self.meter: RunMeter | None = None

        def on_train_start(self, trainer, pl_module):
            import torch

            inner = getattr(pl_module, "model", None)  # the model the recipe was applied to, when it is held there
            self.meter = RunMeter(self.recipe, inner if isinstance(inner, torch.nn.Module) else pl_module)

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if self.meter is not None:
                self.meter.begin()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if self.meter is not None:
                self.meter.step(batch)

        def on_train_end(self, trainer, pl_module):
            if self.meter is not None:
                where = self.output_dir or trainer.log_dir or trainer.default_root_dir
                finish_meter(self.meter, where if trainer.is_global_zero else None, log)

    return RecipeCallback
