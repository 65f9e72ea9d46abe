"""Models by name: the GPT-2 family, Hugging Face models (`hf:...`, see `model.hf`), or a
user's `package.module:factory`."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from autotune.errors import UsageError
from autotune.model.hf import HF_MODELS, build_hf_model, check_hf_name, is_builtin_hf_name, is_hf_name
from autotune.model.sizes import MODEL_SIZES

if TYPE_CHECKING:
    import torch.nn as nn


def build_model(name: str) -> nn.Module:
    """`gpt2`, `gpt2-medium`, `gpt2-large`, `gpt2-xl`, `gpt2-tiny`; `hf:NAME` or `hf:PATH`
    (a transformers model, random weights); or `package.module:factory`."""
    if name in MODEL_SIZES:
        from autotune.model.gpt import GPT  # torch: only when a model is built, not when named

        return GPT(MODEL_SIZES[name])
    if is_hf_name(name):
        return build_hf_model(name)
    if ":" in name:
        return _build_user_model(name)
    raise _unknown(name)


def check_model_name(name: str) -> None:
    """Validate a model name without building it (cheap: for the CLI and the tuner)."""
    if name in MODEL_SIZES:
        return
    if is_hf_name(name):
        check_hf_name(name)
        return
    if ":" in name:
        _load_factory(name)
        return
    raise _unknown(name)


def is_factory_name(name: str) -> bool:
    """`package.module:factory`: building it imports a module and calls it."""
    return ":" in name and not is_hf_name(name)


def is_users_code(name: str) -> bool:
    """Whether building `name` runs code or reads files the user supplied (a factory
    `package.module:fn`, a config directory `hf:PATH`), not one of autotune's own models."""
    return ":" in name and not is_builtin_hf_name(name)


def _unknown(name: str) -> UsageError:
    hf = ", ".join(f"hf:{n}" for n in HF_MODELS)
    return UsageError(
        f"unknown model {name!r}: expected one of {', '.join(MODEL_SIZES)}, {hf}, hf:PATH (a local Hugging Face "
        "config directory) or package.module:factory"
    )


def _load_factory(name: str):
    module_name, _, attr = name.partition(":")
    # Like `python -m`, let a factory in the working directory be found.
    cwd = str(Path.cwd())
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"model {name!r}: cannot import module {module_name!r} ({exc})") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise UsageError(f"model {name!r}: {module_name} has no callable {attr!r}")
    return factory


def _build_user_model(name: str) -> nn.Module:
    import torch.nn as nn

    from autotune.model.contract import check_label_alignment

    factory = _load_factory(name)
    model = factory()
    if not isinstance(model, nn.Module):
        raise UsageError(f"model {name!r}: the factory returned {type(model).__name__}, expected a torch.nn.Module")
    check_label_alignment(model, name)  # before anything is measured on it
    return model
