"""Search spaces: a space as a value (`definition`), read and validated from YAML (`file`), and
sampled into configurations by an Optuna trial (`sampling`). Torch-free: the tuner reads spaces
without importing torch."""

from __future__ import annotations
