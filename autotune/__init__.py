"""autotune: find, on your own GPU, the fastest way to train a GPT-2-class model within a
memory limit, and take the answer home as a recipe."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
