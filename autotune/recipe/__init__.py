"""The recipe: the best configuration a study found, as a versioned file (`recipe`), applied
in a training script (`training`), exported to other frameworks (`export`), re-measured
(`verify`) and profiled (`profile`)."""

from __future__ import annotations

from autotune.errors import RecipeEnvironmentWarning
from autotune.recipe.recipe import Recipe

__all__ = ["Recipe", "RecipeEnvironmentWarning"]
