"""autotune: find, on your own GPU, the fastest way to train a GPT-2-class model within a
memory limit, and take the answer home as a recipe.

    import autotune
    recipe = autotune.Recipe.load("recipes/gpt2-nvidia-h200.json")

`import autotune` stays light: the recipe module imports torch only when a training-side
method is called."""

from __future__ import annotations

__version__ = "0.1.0"

# After __version__: autotune.recipe reads it from this (partly initialized) module.
from autotune.recipe import Recipe  # noqa: E402

__all__ = ["Recipe", "__version__"]
