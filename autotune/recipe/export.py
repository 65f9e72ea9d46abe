"""A recipe in another framework's words: the recipe file itself (json, yaml), or Python
source to paste into a Hugging Face or Lightning training script (hf, lightning).

The snippets say what the framework cannot express as comments beside the closest
setting, so nothing of the recipe is silently lost in translation. Every snippet is valid
Python (`ast.parse` accepts it) and imports nothing it does not use."""

from __future__ import annotations

import json
from typing import Any, Callable

import yaml

from autotune.config import SDPA_KERNELS
from autotune.errors import UsageError
from autotune.recipe.recipe import Recipe

FORMATS = ("json", "yaml", "hf", "lightning")


def render(recipe: Recipe, fmt: str) -> str:
    """The recipe as `fmt` text (json | yaml | hf | lightning), ending with a newline."""
    renderers: dict[str, Callable[[Recipe], str]] = {
        "json": _json,
        "yaml": _yaml,
        "hf": _hf,
        "lightning": _lightning,
    }
    if fmt not in renderers:
        raise UsageError(f"unknown export format {fmt!r}; formats: {', '.join(FORMATS)}")
    return renderers[fmt](recipe)


def _json(recipe: Recipe) -> str:
    return json.dumps(recipe.to_dict(), indent=2) + "\n"  # byte-for-byte what Recipe.save writes


def _yaml(recipe: Recipe) -> str:
    return yaml.safe_dump(recipe.to_dict(), sort_keys=False)


# ----------------------------------------------------------------------------- helpers


def _seq_len(recipe: Recipe) -> int | None:
    value = recipe.model.get("seq_len")
    return int(value) if isinstance(value, int) and value > 0 else None


def sequences_per_step(recipe: Recipe) -> int:
    """A fixed batch size for frameworks that have no token budget: budget // seq_len."""
    seq_len = _seq_len(recipe)
    return max(1, recipe.config.token_budget // seq_len) if seq_len else 1


def _kwargs_block(name: str, items: list[tuple[str, Any, str]]) -> list[str]:
    """`name = dict(` one `key=value,  # why` line each `)`."""
    lines = [f"{name} = dict("]
    for key, value, comment in items:
        line = f"    {key}={value!r},"
        lines.append(f"{line}  # {comment}" if comment else line)
    lines.append(")")
    return lines


def _header(recipe: Recipe, what: str) -> list[str]:
    model = recipe.model.get("name") or "the model"
    lines = [f"# {what} for the autotune recipe of {model}"]
    tps = recipe.measured.get("tokens_per_sec")
    where = recipe.hardware.get("name")
    if tps or where:
        lines.append("# measured" + (f" at {tps:,.0f} tokens/s" if tps else "") + (f" on {where}" if where else ""))
    if recipe.study.get("name"):
        lines.append(f"# study {recipe.study['name']}, trial {recipe.study.get('trial')}")
    return lines


def _checkpoint_comment(recipe: Recipe) -> list[str]:
    layers = list(recipe.config.checkpoint_layers)
    n_layer = recipe.model.get("n_layer")
    of = f" of {n_layer}" if n_layer else ""
    return [f"# Activation checkpointing: the recipe checkpoints blocks {layers}{of} only."] if layers else []


def _sdpa_comment(recipe: Recipe, *, hf: bool) -> list[str]:
    backend = recipe.config.sdpa_backend
    if hf:
        lines = ['# Attention: load the model with attn_implementation="sdpa" (PyTorch scaled_dot_product_attention).']
    else:
        lines = ["# Attention: the model should call torch.nn.functional.scaled_dot_product_attention."]
    if backend != "auto":
        lines += [
            f"# The recipe forces the {backend} SDPA backend; no training argument does that. Wrap training in:",
            "#     from torch.nn.attention import SDPBackend, sdpa_kernel",
            f"#     with sdpa_kernel([SDPBackend.{SDPA_KERNELS[backend]}]):",
            "#         trainer.train()" if hf else "#         trainer.fit(...)",
        ]
    return lines


def _batching_comment(recipe: Recipe) -> list[str]:
    cfg, seq_len = recipe.config, _seq_len(recipe)
    if seq_len:
        lines = [f"# Batch size {sequences_per_step(recipe)} = token_budget {cfg.token_budget} // seq_len {seq_len}."]
    else:
        lines = ["# The recipe records no seq_len: set the batch size to token_budget // your sequence length."]
    if cfg.batching == "padded":
        lines += [
            f"# The recipe batches by token budget ({cfg.token_budget} tokens a step, padding included),",
            "# grouping sequences of similar length; a fixed batch size cannot express that.",
        ]
    elif cfg.batching == "packed":
        lines += [
            f"# The recipe packs documents into windows of seq_len + 1{f' = {seq_len + 1}' if seq_len else ''} tokens",
            "# (no padding): pack the dataset before training.",
        ]
    return lines


# ----------------------------------------------------------------------- Hugging Face


def hf_training_args(recipe: Recipe) -> dict[str, Any]:
    """The `transformers.TrainingArguments` keyword arguments closest to the recipe."""
    cfg = recipe.config
    workers = cfg.num_workers > 0
    args: dict[str, Any] = {
        "per_device_train_batch_size": sequences_per_step(recipe),
        "dataloader_num_workers": cfg.num_workers,
        "dataloader_pin_memory": cfg.pin_memory,
        "dataloader_prefetch_factor": cfg.prefetch_factor if workers else None,
        "dataloader_persistent_workers": cfg.persistent_workers,
        "bf16": cfg.amp_dtype == "bfloat16",
        "fp16": cfg.amp_dtype == "float16",
        "tf32": cfg.amp_dtype == "tf32",
        "torch_compile": cfg.compile_mode != "none",
        "torch_compile_mode": None if cfg.compile_mode == "none" else cfg.compile_mode,
        "gradient_checkpointing": bool(cfg.checkpoint_layers),
    }
    if cfg.batching == "padded":
        args["group_by_length"] = True
    return args


_HF_COMMENTS = {
    "per_device_train_batch_size": "token_budget // seq_len (see below)",
    "dataloader_prefetch_factor": "batches each worker loads ahead",
    "tf32": "TF32 tensor-core matmuls for float32 (Ampere or newer)",
    "torch_compile_mode": "the recipe compiles each block; Trainer compiles the whole model",
    "gradient_checkpointing": "Trainer checkpoints every block (see below)",
    "group_by_length": "closest to the recipe's token-budget length grouping",
}


def _hf(recipe: Recipe) -> str:
    args = hf_training_args(recipe)
    cfg = recipe.config
    lines = _header(recipe, "Hugging Face TrainingArguments")
    lines += ["# Use: TrainingArguments(output_dir=..., **training_args)", ""]
    # A comment only beside settings in effect: "compiles each block" next to None would confuse.
    lines += _kwargs_block(
        "training_args", [(k, v, _HF_COMMENTS.get(k, "") if v not in (None, False) else "") for k, v in args.items()]
    )
    lines += ["", "# What TrainingArguments cannot express:"]
    if cfg.checkpoint_layers:
        lines += _checkpoint_comment(recipe)
        lines += [
            "# gradient_checkpointing=True checkpoints all blocks, recomputing more than the recipe does.",
            "# For exactly these blocks, leave it False and call autotune.Recipe.apply_to_model(model).",
        ]
    lines += _sdpa_comment(recipe, hf=True)
    lines += _batching_comment(recipe)
    if cfg.batching == "padded":
        lines.append("# group_by_length=True is the closest: it groups by length, at a fixed batch size.")
    return "\n".join(lines) + "\n"


# -------------------------------------------------------------------------- Lightning


_LIGHTNING_PRECISION = {"bfloat16": "bf16-mixed", "float16": "16-mixed", "float32": "32-true", "tf32": "32-true"}


def lightning_kwargs(recipe: Recipe) -> tuple[dict[str, Any], dict[str, Any]]:
    """(Trainer kwargs, DataLoader kwargs) closest to the recipe."""
    cfg = recipe.config
    workers = cfg.num_workers > 0
    trainer = {"precision": _LIGHTNING_PRECISION[cfg.amp_dtype]}
    loader = {
        "batch_size": sequences_per_step(recipe),
        "num_workers": cfg.num_workers,
        "pin_memory": cfg.pin_memory,
        "prefetch_factor": cfg.prefetch_factor if workers else None,
        "persistent_workers": cfg.persistent_workers,
    }
    return trainer, loader


def _lightning(recipe: Recipe) -> str:
    trainer, loader = lightning_kwargs(recipe)
    cfg = recipe.config
    lines = _header(recipe, "Lightning Trainer and DataLoader settings")
    lines += ["# Use: lightning.Trainer(**trainer_kwargs, ...) and DataLoader(dataset, **dataloader_kwargs)", ""]
    if cfg.amp_dtype == "tf32":
        lines += [
            "import torch",
            "",
            "# tf32: float32 weights, TF32 tensor-core matmuls (Ampere or newer).",
            'torch.set_float32_matmul_precision("high")',
            "",
        ]
    lines += _kwargs_block("trainer_kwargs", [(k, v, "") for k, v in trainer.items()])
    lines.append("")
    lines += _kwargs_block("dataloader_kwargs", [(k, v, "") for k, v in loader.items()])
    lines += [""]
    lines += _batching_comment(recipe)
    lines.append("# For the recipe's own batches, use autotune.Recipe.dataloader(dataset) instead of DataLoader.")
    if cfg.checkpoint_layers:
        lines += _checkpoint_comment(recipe)
        lines += [
            "# In LightningModule.configure_model, wrap those blocks' forward in",
            "# torch.utils.checkpoint.checkpoint(..., use_reentrant=False), or call",
            "# autotune.Recipe.apply_to_model(self.model) there (checkpointing, then compile).",
        ]
    if cfg.compile_mode != "none":
        lines += [
            f'# Compile: in configure_model, block.compile(mode="{cfg.compile_mode}") for each block',
            "# (after checkpointing), or torch.compile the model; apply_to_model does both in order.",
        ]
    lines += _sdpa_comment(recipe, hf=False)
    return "\n".join(lines) + "\n"
