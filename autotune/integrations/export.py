"""A recipe in another framework's words: the recipe file itself (json, yaml); the keyword
arguments of Hugging Face `TrainingArguments` or Lightning `Trainer` as Python to paste (hf,
lightning) or as JSON for a script to load (hf-json, lightning-json); the shell that launches a
recipe of several ranks (torchrun) or sets a recipe's environment (env).

The arguments come from `autotune.integrations` (field names of the installed library, and
checked by constructing the library's object, when it is installed). The Python snippets say
what the framework cannot express as comments, so nothing of the recipe is silently lost in
translation; every snippet is valid Python (`ast.parse` accepts it) and imports nothing it
does not use. Every value written into a snippet or a script goes through one quoting function
of `integrations.common` (a comment, a Python literal or name, a shell word): a recipe's text
fields are its author's, and must never become code (issue D, X01/X02)."""

from __future__ import annotations

import json
from typing import Any, Callable

import yaml

from autotune import registry
from autotune.config import SDPA_KERNELS
from autotune.errors import UsageError
from autotune.integrations import generation, hf, lightning
from autotune.integrations.common import (
    comment,
    python_literal,
    python_name,
    recipe_seq_len,
    sequences_per_step,
    shell_word,
)
from autotune.recipe.recipe import Recipe

TRAINING_FORMATS = ("hf", "hf-json", "lightning", "lightning-json", "env", "torchrun")
GENERATION_FORMATS = ("hf-generate", "hf-generate-json", "decode-loop")  # a generation recipe's (`generation`)
FORMATS = ("json", "yaml", *TRAINING_FORMATS, *GENERATION_FORMATS)


def render(recipe: Recipe, fmt: str) -> str:
    """The recipe as `fmt` text (see FORMATS), ending with a newline."""
    renderers: dict[str, Callable[[Recipe], str]] = {
        "json": _json,
        "yaml": _yaml,
        "hf": _hf,
        "hf-json": _hf_json,
        "lightning": _lightning,
        "lightning-json": _lightning_json,
        "env": _env,
        "torchrun": _torchrun,
        "hf-generate": generation.hf_generate,
        "hf-generate-json": generation.hf_generate_json,
        "decode-loop": generation.decode_loop,
    }
    if fmt not in renderers:
        raise UsageError(f"unknown export format {fmt!r}; formats: {', '.join(FORMATS)}")
    own = GENERATION_FORMATS if recipe.task == registry.GENERATE else TRAINING_FORMATS
    if fmt not in ("json", "yaml", *own):
        raise UsageError(f"--format {fmt} is not for a {recipe.task} recipe; its formats: json, yaml, {', '.join(own)}")
    return renderers[fmt](recipe)


def _json(recipe: Recipe) -> str:
    return json.dumps(recipe.to_dict(), indent=2) + "\n"  # byte-for-byte what Recipe.save writes


def _yaml(recipe: Recipe) -> str:
    return yaml.safe_dump(recipe.to_dict(), sort_keys=False)


def _hf_json(recipe: Recipe) -> str:
    """`TrainingArguments(output_dir=..., **json.load(f))`."""
    return json.dumps(hf.training_arguments(recipe), indent=2) + "\n"


def _lightning_json(recipe: Recipe) -> str:
    """{"trainer": Trainer kwargs, "dataloader": DataLoader kwargs, "environment": variables to
    set before CUDA starts}."""
    data = {
        "trainer": lightning.checked_trainer_kwargs(recipe)[0],  # a strategy as {"class_path", "init_args"}
        "dataloader": lightning.dataloader_kwargs(recipe),
        "environment": recipe.environment(),
    }
    return json.dumps(data, indent=2) + "\n"


def _env(recipe: Recipe) -> str:
    """Shell lines to run before training starts: `eval "$(autotune export R --format env)"`."""
    env = recipe.environment()
    if not env:
        return comment("nothing to set: the recipe was measured on a CPU without allocator settings") + "\n"
    lines = [comment("the CUDA caching allocator's settings: set before the training process starts CUDA")]
    return "\n".join(lines + _exports(env)) + "\n"


def _exports(env: dict[str, str]) -> list[str]:
    return [f"export {python_name(name)}={shell_word(value)}" for name, value in env.items()]


def _torchrun(recipe: Recipe) -> str:
    """The shell that launches a recipe of N ranks as it was measured: one process per device by
    torchrun on this host, each rank's OMP_NUM_THREADS its share of the host's cores less its
    DataLoader workers (each a process of its own), and the allocator's environment. A recipe of
    one rank says so: there is nothing to launch."""
    ranks, cfg = int(recipe.world_size), recipe.config  # whole numbers: the shell's arithmetic takes them
    exports = _exports(recipe.environment())
    model = recipe.model.get("name") or "the model"
    if ranks == 1:
        lines = [
            comment(
                f"The autotune recipe of {model} is a single-process recipe (measured on one rank, parallelism=none):"
            ),
            comment("nothing to launch with torchrun. Run your training script as it is."),
        ]
        return "\n".join(lines + exports + ["python train.py"]) + "\n"
    workers = int(cfg.num_workers)
    lines = [
        comment(f"torchrun launch of the autotune recipe of {model}: {ranks} ranks, parallelism={cfg.parallelism}"),
        comment("(one process per device; train.py is your script: it calls torch.distributed.init_process_group(),"),
        comment(
            "then recipe.apply_to_model(model); on GPUs torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) first)."
        ),
        comment(
            f"OMP_NUM_THREADS per rank: this host's cores shared by the {ranks} ranks"
            + (f", less each rank's {workers} DataLoader worker{'s' if workers != 1 else ''}." if workers else ".")
        ),
        f"threads=$(( $(nproc) / {ranks}{f' - {workers}' if workers else ''} ))",
        '[ "$threads" -ge 1 ] || threads=1',
        'export OMP_NUM_THREADS="$threads"',
    ]
    if exports:
        lines += [comment("the CUDA caching allocator's settings, read once when CUDA starts"), *exports]
    return "\n".join(lines + [f"torchrun --standalone --nproc-per-node {ranks} train.py"]) + "\n"


def _environment_block(recipe: Recipe) -> list[str]:
    """Python that sets the recipe's environment, first thing: the allocator reads it once, when
    CUDA starts, so it must run before anything touches CUDA (or be exported in the shell)."""
    env = recipe.environment()
    if not env:
        return []
    lines = ["import os", "", comment("Before anything starts CUDA: the caching allocator reads this once.")]
    return lines + [f"os.environ[{python_literal(k)}] = {python_literal(v)}" for k, v in env.items()] + [""]


# ----------------------------------------------------------------------------- helpers


def _kwargs_block(name: str, items: list[tuple[str, Any, str]]) -> list[str]:
    """`name = dict(` one `key=value,  # why` line each `)`."""
    lines = [f"{name} = dict("]
    for key, value, why in items:
        line = f"    {python_name(key)}={python_literal(value)},"
        lines.append(f"{line}  {comment(why)}" if why else line)
    lines.append(")")
    return lines


def _header(recipe: Recipe, what: str, checked: str) -> list[str]:
    model = recipe.model.get("name") or "the model"
    lines = [f"{what} for the autotune recipe of {model}"]
    tps = recipe.measured.get("tokens_per_sec")
    where = recipe.hardware.get("name")
    if tps or where:
        lines.append("measured" + (f" at {tps:,.0f} tokens/s" if tps else "") + (f" on {where}" if where else ""))
    if recipe.measured.get("unstable"):
        lines.append("UNSTABLE: its step times varied (CV above 5%); re-measure with `autotune verify`")
    if recipe.study.get("name"):
        lines.append(f"study {recipe.study['name']}, trial {recipe.study.get('trial')}")
    return [comment(line) for line in [*lines, checked]]


def _notes(lines: list[str]) -> list[str]:
    return [comment(f"- {line}") for line in lines]


def _sdpa_wrap(recipe: Recipe, call: str) -> list[str]:
    backend = recipe.config.sdpa_backend
    if backend == "auto":
        return []
    return [
        comment("    from torch.nn.attention import SDPBackend, sdpa_kernel"),
        comment(f"    with sdpa_kernel([SDPBackend.{SDPA_KERNELS[backend]}]):"),
        comment(f"        {call}"),
    ]


def _batch_comment(recipe: Recipe) -> str:
    seq_len = recipe_seq_len(recipe)
    if not seq_len:
        return "the recipe records no seq_len: token_budget // your sequence length"
    micro = " per micro-batch" if recipe.accumulation_steps > 1 else ""
    return f"token_budget {recipe.config.token_budget} // seq_len {seq_len}{micro} (the recipe's; yours may differ)"


def _accumulation_comment(recipe: Recipe) -> str:
    return (
        f"{recipe.accumulation_steps} micro-batches of {recipe.config.token_budget} tokens: "
        f"the global batch of {recipe.global_batch_tokens}"
        if recipe.global_batch_tokens is not None
        else "no global batch in the recipe: one micro-batch per optimizer step"
    )


# ----------------------------------------------------------------------- Hugging Face


_HF_COMMENTS = {
    "dataloader_prefetch_factor": "batches each worker loads ahead",
    "tf32": "TF32 tensor-core matmuls for float32 (Ampere or newer)",
    "torch_compile_mode": "Trainer compiles the whole model (see below)",
    "activation_checkpointing": "Trainer checkpoints every block (see below)",
    "gradient_checkpointing": "Trainer checkpoints every block (see below)",
    "train_sampling_strategy": "closest to the recipe's token-budget length grouping",
    "group_by_length": "closest to the recipe's token-budget length grouping",
    "use_cpu": "measured on a CPU (transformers refuses bf16 on a CPU without it)",
}


def _hf(recipe: Recipe) -> str:
    args, checked = hf.checked_training_arguments(recipe)
    lines = _header(recipe, "Hugging Face TrainingArguments", checked)
    lines += [comment("Use: TrainingArguments(output_dir=..., **training_args)"), ""]
    lines += _environment_block(recipe)
    comments = {
        **_HF_COMMENTS,
        "per_device_train_batch_size": _batch_comment(recipe),
        "gradient_accumulation_steps": _accumulation_comment(recipe),
    }
    lines += _kwargs_block("training_args", [(k, v, comments.get(k, "")) for k, v in args.items()])
    lines += ["", comment("What TrainingArguments cannot express:")]
    lines += _notes(hf.notes(recipe, args))
    lines += _sdpa_wrap(recipe, "trainer.train()")
    return "\n".join(lines) + "\n"


# -------------------------------------------------------------------------- Lightning


def _lightning(recipe: Recipe) -> str:
    trainer, checked = lightning.checked_trainer_kwargs(recipe)
    strategy = trainer.pop("strategy", None)  # a recipe of several ranks: {"class_path", "init_args"}
    loader = lightning.dataloader_kwargs(recipe)
    lines = _header(recipe, "Lightning Trainer and DataLoader settings", checked)
    use = (
        "lightning.Trainer(**trainer_kwargs, strategy=strategy, ...)"
        if strategy
        else "lightning.Trainer(**trainer_kwargs, ...)"
    )
    lines += [comment(f"Use: {use} and DataLoader(dataset, **dataloader_kwargs)"), ""]
    lines += _environment_block(recipe)
    if strategy:
        module, _, name = strategy["class_path"].rpartition(".")
        module, name = python_name(module), python_name(name)
        arguments = ", ".join(f"{python_name(k)}={python_literal(v)}" for k, v in strategy["init_args"].items())
        lines += [f"from {module} import {name}", "", f"strategy = {name}({arguments})", ""]
    if recipe.config.amp_dtype == "tf32":
        lines += [
            "import torch",
            "",
            comment("tf32: float32 weights, TF32 tensor-core matmuls (Ampere or newer)."),
            'torch.set_float32_matmul_precision("high")',
            "",
        ]
    trainer_comments = {"accumulate_grad_batches": _accumulation_comment(recipe)}
    lines += _kwargs_block("trainer_kwargs", [(k, v, trainer_comments.get(k, "")) for k, v in trainer.items()])
    lines.append("")
    comments = {"batch_size": _batch_comment(recipe)}
    lines += _kwargs_block("dataloader_kwargs", [(k, v, comments.get(k, "")) for k, v in loader.items()])
    lines += ["", comment("What Trainer and DataLoader arguments cannot express:")]
    lines += _notes([n for n in lightning.notes(recipe) if not n.startswith("tf32")])
    lines += _sdpa_wrap(recipe, "trainer.fit(...)")
    return "\n".join(lines) + "\n"


__all__ = ["FORMATS", "render", "sequences_per_step"]
