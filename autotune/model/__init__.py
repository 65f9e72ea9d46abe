"""Models: the GPT-2 family (`gpt`, its shapes in `sizes`), loading by name (`load`), and
reading any model's shape and blocks (`introspect`).

Imported lazily (PEP 562): `autotune.model.sizes` is read by the tuner, which never imports
torch; the names below import their module, and torch, when first used."""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "GPT": "gpt",
    "MODEL_SIZES": "sizes",
    "GPTConfig": "sizes",
    "ModelShape": "introspect",
    "find_blocks": "introspect",
    "model_shape": "introspect",
    "non_embedding_params": "introspect",
    "build_model": "load",
    "check_model_name": "load",
}
__all__ = list(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
