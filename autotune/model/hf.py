"""Hugging Face `transformers` models: built from a config with random weights (nothing is
downloaded), by name (`hf:gpt2`, `hf:llama-tiny`, ...) or from a local config directory
(`hf:PATH`), and recognized wherever autotune meets one (knobs, the training step, data).

transformers is imported only when an `hf:` model is built, or when a model already is one
(`sys.modules` says whether transformers is loaded at all), so `import autotune` stays light."""

from __future__ import annotations

import importlib.util
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: reading a model name imports no torch
    import torch.nn as nn

from autotune.errors import UsageError

log = logging.getLogger(__name__)

HF_PREFIX = "hf:"
_BYTE_EOT = 256  # the tiny models' byte-level vocabulary: 256 bytes, then end-of-text (as gpt2-tiny)

# Named configs: (config class, its arguments). The GPT-2 sizes are OpenAI's release (vocabulary
# 50257, context 1024, dropout 0.1 as in the released config); smollm-135m is the public
# SmolLM-135M Llama; the tiny ones are for CPUs and tests, the shape of autotune's gpt2-tiny.
HF_MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "gpt2": ("GPT2Config", {"n_layer": 12, "n_head": 12, "n_embd": 768}),  # 124M
    "gpt2-medium": ("GPT2Config", {"n_layer": 24, "n_head": 16, "n_embd": 1024}),  # 355M
    "gpt2-large": ("GPT2Config", {"n_layer": 36, "n_head": 20, "n_embd": 1280}),  # 774M
    "gpt2-xl": ("GPT2Config", {"n_layer": 48, "n_head": 25, "n_embd": 1600}),  # 1.5B
    "gpt2-tiny": (
        "GPT2Config",
        {
            "n_layer": 2,
            "n_head": 2,
            "n_embd": 64,
            "n_positions": 128,
            "vocab_size": 320,  # 256 bytes + end-of-text, padded to a multiple of 64
            "bos_token_id": _BYTE_EOT,
            "eos_token_id": _BYTE_EOT,
        },
    ),
    "smollm-135m": (
        "LlamaConfig",
        {
            "vocab_size": 49152,
            "hidden_size": 576,
            "intermediate_size": 1536,
            "num_hidden_layers": 30,
            "num_attention_heads": 9,
            "num_key_value_heads": 3,
            "max_position_embeddings": 2048,
            "rms_norm_eps": 1e-5,
            "tie_word_embeddings": True,
            "bos_token_id": 0,
            "eos_token_id": 0,
        },
    ),
    "llama-tiny": (
        "LlamaConfig",
        {
            "vocab_size": 320,
            "hidden_size": 64,
            "intermediate_size": 176,  # about 8/3 of the width, as Llama's SwiGLU
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,  # grouped-query attention, as Llama 2 70B and Llama 3
            "max_position_embeddings": 128,
            "bos_token_id": _BYTE_EOT,
            "eos_token_id": _BYTE_EOT,
        },
    ),
}


def is_hf_name(name: str) -> bool:
    return name.startswith(HF_PREFIX)


def is_builtin_hf_name(name: str) -> bool:
    """`hf:NAME` with NAME one of HF_MODELS (not a path)."""
    return is_hf_name(name) and name[len(HF_PREFIX) :] in HF_MODELS


def check_hf_name(name: str) -> None:
    """Validate an `hf:` model name without building it or importing transformers."""
    if importlib.util.find_spec("transformers") is None:
        raise UsageError(f"model {name!r} needs Hugging Face transformers: pip install transformers")
    _resolve(name[len(HF_PREFIX) :])


def _resolve(spec: str) -> tuple[str, Any]:
    """("named", key) or ("path", config directory) for what follows `hf:`."""
    if spec in HF_MODELS:
        return "named", spec
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UsageError(f"model 'hf:{spec}': {path} has no config.json (a Hugging Face model directory has one)")
        return "path", path
    raise UsageError(
        f"unknown model 'hf:{spec}': expected hf: followed by one of {', '.join(HF_MODELS)}, "
        "or by a local directory holding a config.json"
    )


def build_hf_model(name: str) -> nn.Module:
    """A transformers causal LM with random weights: `hf:NAME` from HF_MODELS, or `hf:PATH`
    from PATH/config.json (its weights, if any, are not loaded: throughput does not depend on
    them). Attention is PyTorch SDPA, so the sdpa_backend knob applies to it."""
    kind, what = _resolve(name[len(HF_PREFIX) :])
    import transformers

    if kind == "named":
        config_class, kwargs = HF_MODELS[what]
        config = getattr(transformers, config_class)(**kwargs)
    else:
        # local_files_only: a directory is read as it is, never completed from the Hub.
        config = transformers.AutoConfig.from_pretrained(str(what), local_files_only=True)
    try:
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    except ValueError as exc:
        if "sdpa" not in str(exc).lower() and "attn_implementation" not in str(exc):
            raise UsageError(f"model {name!r}: transformers cannot build it ({exc})") from None
        log.info("model %s: no SDPA attention in this architecture; built with its default attention", name)
        model = transformers.AutoModelForCausalLM.from_config(config)
    return model


def is_hf_model(model: object) -> bool:
    """A transformers `PreTrainedModel` (compiled whole or not). Reads `sys.modules`: a model
    cannot be one unless transformers is already imported."""
    transformers = sys.modules.get("transformers")
    if transformers is None:
        return False
    model = getattr(model, "_orig_mod", model)  # torch.compile(model) wraps it
    return isinstance(model, transformers.PreTrainedModel)


_NO_CACHE_MARK = "_autotune_kv_cache_off"


def turn_off_kv_cache(model: nn.Module) -> bool:
    """Make every call that does not ask for a KV cache run without one; True if it was on.

    A cache is for generation. In training it only costs: each block writes its layer of
    it, so a compiled block gets one guard per layer and dynamo hits its recompile limit (8)
    in the first train-plus-eval step, then runs eager; and a checkpointed block writes it a
    second time when it is recomputed in backward, which fails (CheckpointError: recomputed
    values have different metadata). Hugging Face's own gradient checkpointing turns it off
    for the same reason.

    A forward pre-hook passes `use_cache=False` when the caller gives no `use_cache`, rather
    than setting `config.use_cache = False`: the config is what `save_pretrained` writes, and
    a saved model should still generate with its cache. `generate()` asks for the cache
    explicitly, so it keeps it. Nothing is added to the state dict."""
    model = getattr(model, "_orig_mod", model)
    config = getattr(model, "config", None)
    if config is None or not getattr(config, "use_cache", False) or getattr(model, _NO_CACHE_MARK, False):
        return False
    model.register_forward_pre_hook(_no_cache_unless_asked, with_kwargs=True)
    setattr(model, _NO_CACHE_MARK, True)
    return True


def _no_cache_unless_asked(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    # Top-level, so a model with the hook still pickles (DataLoader workers, deepcopy).
    if "use_cache" not in kwargs:
        kwargs = {**kwargs, "use_cache": False}
    return args, kwargs


SDPA = "sdpa"


def attention_implementation(model: object) -> str | None:
    """The attention a transformers model runs ("sdpa", "eager", "flash_attention_2", ...);
    None for any other model."""
    if not is_hf_model(model):
        return None
    config = getattr(getattr(model, "_orig_mod", model), "config", None)
    value = getattr(config, "_attn_implementation", None)
    return value if isinstance(value, str) else None


def use_sdpa_attention(model: nn.Module) -> bool:
    """Switch a transformers model's attention to PyTorch SDPA; False, unchanged, where the
    architecture has none (transformers validates before it changes anything)."""
    try:
        getattr(model, "_orig_mod", model).set_attn_implementation(SDPA)
    except (ValueError, ImportError, AttributeError):
        return False
    return attention_implementation(model) == SDPA
