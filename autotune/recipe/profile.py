"""`autotune profile`: a recipe's training step under torch.profiler (see `measure.profile`)."""

from __future__ import annotations

from pathlib import Path

from autotune.measure.profile import ProfileReport, profile_config
from autotune.recipe.recipe import Recipe


def profile_recipe(
    recipe: Recipe,
    *,
    device: str = "auto",
    steps: int = 10,
    out_dir: str | Path,
    model=None,
    model_name: str | None = None,
    data: str = "synthetic",
    warmup: int = 2,
    seed: int = 0,
    top: int = 15,
) -> ProfileReport:
    """Profile the recipe's configuration on `model` (a module), or the model named
    `model_name`, else the recipe's own (see `Recipe.model_to_run`), at its sequence length and
    with its global batch (gradient accumulation, as measured)."""
    seq_len = recipe.model.get("seq_len")
    return profile_config(
        recipe.config,
        model_name=model_name or (None if model is not None else recipe.model_to_run()),
        seq_len=seq_len if isinstance(seq_len, int) else None,
        device=device,
        steps=steps,
        out_dir=out_dir,
        model=model,
        data=data,
        warmup=warmup,
        seed=seed,
        top=top,
        global_batch_tokens=recipe.global_batch_tokens,
    )
