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
"""

from __future__ import annotations

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


def lightning_version() -> str | None:
    return installed_version("lightning", "pytorch_lightning", "pytorch-lightning")


def trainer_kwargs(recipe: Recipe, *, check: bool = True) -> dict[str, Any]:
    """`Trainer` keyword arguments closest to the recipe: its precision, and
    accumulate_grad_batches when the recipe accumulates to a global batch. tf32 has no Trainer
    argument: call torch.set_float32_matmul_precision("high") (see `notes`). check: construct
    a Trainer from them first (when Lightning is installed)."""
    return checked_trainer_kwargs(recipe, check=check)[0]


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
    callback: nothing is written); return what was checked, in one line."""
    version = lightning_version()
    if version is None:
        raise UsageError("checking Trainer arguments needs Lightning: pip install lightning")
    try:
        import lightning as pl
    except ImportError:
        import pytorch_lightning as pl  # type: ignore[no-redef]
    quiet = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    with quietly("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning", "lightning_fabric"):
        try:
            pl.Trainer(**kwargs, **quiet)
        except Exception as exc:  # Lightning raises its own MisconfigurationException, among others
            raise AutotuneError(f"Lightning {version} refuses these Trainer arguments: {exc}") from None
    return f"checked: Lightning {version} accepts these Trainer arguments"


def notes(recipe: Recipe) -> list[str]:
    """What Trainer and DataLoader arguments cannot express, one sentence a line: the global
    batch, the recipe's own batches, checkpointing and compile (`apply_to_model` in
    configure_model), then each knob's own (`registry.Knob.lightning_note`)."""
    cfg = recipe.config
    lines = []
    if recipe.global_batch_tokens is not None:
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
    done = []
    if cfg.checkpoint_layers:
        done.append(
            f"checkpoints {checkpointed_blocks(recipe)} "
            "(torch.utils.checkpoint.checkpoint of each one's forward, use_reentrant=False)"
        )
    if cfg.compile_mode != "none":
        done.append(f"{'then ' if done else ''}compiles {compiled_scope(recipe)}")
    if done:
        lines.append(
            f"The recipe {', '.join(done)}: call recipe.apply_to_model(self.model) in "
            "LightningModule.configure_model, which does exactly that."
        )
    return lines + knob_notes("lightning_note", "Lightning", View(recipe))
