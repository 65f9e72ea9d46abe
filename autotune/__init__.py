"""autotune: find, on your own GPU, the fastest way to train a GPT-2-class model within a
memory limit, and take the answer home as a recipe.

    import autotune
    recipe = autotune.Recipe.load("recipes/gpt2-nvidia-h200.json")

`import autotune` stays light: the recipe module imports torch only when a training-side
method is called."""

from __future__ import annotations

from autotune._version import __version__
from autotune.recipe import Recipe

__all__ = ["Recipe", "__version__"]
