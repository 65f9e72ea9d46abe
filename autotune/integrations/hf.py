"""A recipe as Hugging Face `transformers.TrainingArguments` keyword arguments.

transformers 5 renamed or dropped several fields, so the names follow the installed version:

    recipe                     transformers 5.x                          transformers 4.x
    padded (length-grouped)    train_sampling_strategy="group_by_length"  group_by_length=True
    checkpoint_layers          activation_checkpointing=True              gradient_checkpointing=True
                               activation_checkpointing_kwargs            gradient_checkpointing_kwargs
    measured on a CPU          use_cpu=True (bf16 on a CPU requires it)   use_cpu=True
    parallelism=fsdp2          fsdp=True, fsdp_config={"version": 2}      fsdp="full_shard",
                                                                          fsdp_config={"fsdp_version": 2}

A recipe of several ranks: DDP's knobs are ddp_* fields (ddp_static_graph where the installed
version has it), FSDP2's reshard_after_forward an fsdp_config key; what has no field (DDP's
gradient_as_bucket_view, FSDP2's reduce dtype) is said in `notes`. Trainer trains over the
processes torchrun launches (`autotune export --format torchrun`).

Without transformers installed, the 5.x names are used (what pip installs today). With it
installed, `training_arguments` constructs `TrainingArguments` from the result before
returning it, so a field the installed version refuses is an error here, not in your script.
On a machine without the recipe's GPU, the checks only a GPU can pass (bf16 without
`use_cpu`, tf32) are left out of that construction, and `checked` says so.

    from transformers import Trainer, TrainingArguments
    from autotune.integrations import hf
    args = TrainingArguments(output_dir="out", **hf.training_arguments(recipe))
    trainer = Trainer(model=model, args=args, train_dataset=dataset, data_collator=hf.data_collator(model))
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import logging
import os
import tempfile
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from autotune.errors import AutotuneError, UsageError
from autotune.integrations.common import (
    View,
    checkpointed_blocks,
    compiled_scope,
    installed_version,
    knob_fields,
    knob_notes,
    quietly,
    sequences_per_step,
)
from autotune.recipe.recipe import Recipe

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Names:
    """The TrainingArguments fields that differ between transformers versions."""

    group_by_length: tuple[str, Any]  # (field, value that turns length grouping on)
    checkpointing: str
    checkpointing_kwargs: str
    fsdp: tuple[Any, str] = (True, "version")  # (fsdp's value that turns FSDP on, fsdp_config's version key)
    ddp_static_graph: bool = True  # TrainingArguments has the field

    @classmethod
    def for_fields(cls, fields: set[str] | None) -> "Names":
        """From the installed TrainingArguments' fields, or the latest names when None."""
        new = fields is None or "train_sampling_strategy" in fields
        grouping = ("train_sampling_strategy", "group_by_length") if new else ("group_by_length", True)
        renamed = fields is None or "activation_checkpointing" in fields
        return cls(
            group_by_length=grouping,
            checkpointing="activation_checkpointing" if renamed else "gradient_checkpointing",
            checkpointing_kwargs="activation_checkpointing_kwargs" if renamed else "gradient_checkpointing_kwargs",
            # transformers 5 turns FSDP on with True and reads fsdp_config's keys without their fsdp_ prefix
            fsdp=(True, "version") if new else ("full_shard", "fsdp_version"),
            ddp_static_graph=fields is None or "ddp_static_graph" in fields,
        )


def transformers_version() -> str | None:
    return installed_version("transformers")


def training_arguments(
    recipe: Recipe, *, seq_len: int | None = None, model_applied: bool = False, check: bool = True
) -> dict[str, Any]:
    """`TrainingArguments` keyword arguments closest to the recipe, in the installed
    transformers' field names (output_dir and the training length are yours to add).

    seq_len: the length of your sequences, for the batch size token_budget // seq_len
    (default: the recipe's). model_applied: True when you called recipe.apply_to_model(model)
    (the recipe's exact blocks checkpointed, then compiled at its compile_scope): the arguments then leave
    checkpointing and compile off, which Trainer would otherwise apply to the whole model
    again. check: construct TrainingArguments from the result first (when transformers is
    installed); an argument it refuses raises AutotuneError."""
    return checked_training_arguments(recipe, seq_len=seq_len, model_applied=model_applied, check=check)[0]


def checked_training_arguments(
    recipe: Recipe, *, seq_len: int | None = None, model_applied: bool = False, check: bool = True
) -> tuple[dict[str, Any], str]:
    """`training_arguments`, and one line saying which version's names they are and what checked them."""
    fields = _installed_fields()
    args = _arguments(recipe, Names.for_fields(fields), seq_len=seq_len, model_applied=model_applied)
    if fields is None:
        return args, "transformers is not installed here: field names of transformers 5.x, not checked"
    said = f"field names of transformers {transformers_version()} (installed)"
    return args, (f"{said}; {check_training_arguments(args)}" if check else said)


def _arguments(recipe: Recipe, names: Names, *, seq_len: int | None, model_applied: bool) -> dict[str, Any]:
    """Each knob's TrainingArguments fields (its registry entry's `hf`), then the recipe's own:
    its accumulation to a global batch, and use_cpu for a CPU recipe."""
    view = View(recipe, names, model_applied, sequences_per_step(recipe, seq_len))
    args = knob_fields("hf", view)
    if recipe.accumulation_steps > 1:  # micro-batches per optimizer step, to the recipe's global batch
        args["gradient_accumulation_steps"] = recipe.accumulation_steps
    if recipe.hardware.get("kind") == "cpu":
        args["use_cpu"] = True  # transformers refuses bf16 on a CPU without it
    return args


def _installed_fields() -> set[str] | None:
    if transformers_version() is None:
        return None
    from transformers import TrainingArguments

    return {f.name for f in dataclasses.fields(TrainingArguments)}


def check_training_arguments(args: dict[str, Any]) -> str:
    """Construct `TrainingArguments(**args)` with the installed transformers; return what was
    checked, in one line. Without CUDA here, the GPU-only checks are left out (use_cpu=True
    is added, tf32 dropped): field names and every other value are still checked."""
    version = transformers_version()
    if version is None:
        raise UsageError("checking TrainingArguments needs transformers: pip install transformers")
    import torch
    from transformers import TrainingArguments

    unknown = sorted(set(args) - {f.name for f in dataclasses.fields(TrainingArguments)})
    if unknown:
        raise AutotuneError(f"transformers {version} has no TrainingArguments field {unknown[0]!r}")
    probe = copy.deepcopy(args)  # TrainingArguments fills fsdp_config in place: the caller's stays as given
    skipped = ""
    if not torch.cuda.is_available() and not probe.get("use_cpu"):
        probe["use_cpu"] = True
        if probe.pop("tf32", None):
            skipped = "; tf32 not checked (no CUDA here)"
        skipped = skipped or "; GPU-only checks skipped (no CUDA here)"
    with tempfile.TemporaryDirectory() as out, quietly("transformers", "accelerate"), _no_side_effects():
        try:
            TrainingArguments(output_dir=out, **probe)
        except (ValueError, TypeError, ImportError) as exc:
            raise AutotuneError(f"transformers {version} refuses these TrainingArguments: {exc}") from None
    return f"checked: transformers {version} accepts these TrainingArguments{skipped}"


@contextlib.contextmanager
def _no_side_effects() -> Iterator[None]:
    """Constructing TrainingArguments is not pure: it writes ACCELERATE_* environment variables
    (with torch_compile, ACCELERATE_DYNAMO_BACKEND makes every later Trainer in the process
    compile its model) and sets up accelerate's process-wide device state. A check leaves the
    process as it found it, so the user's own TrainingArguments decide."""
    environ = dict(os.environ)
    try:
        from accelerate.state import PartialState
    except ImportError:  # transformers then refuses to build TrainingArguments itself
        PartialState = None
    was_set_up = PartialState is not None and bool(PartialState._shared_state)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(environ)
        if PartialState is not None and not was_set_up:
            PartialState._reset_state()


def notes(recipe: Recipe, args: dict[str, Any]) -> list[str]:
    """What TrainingArguments cannot express, one sentence a line: checkpointing and compile
    together (Trainer does both to the whole model), the global batch, then each knob's own
    (`registry.Knob.hf_note`, or a plain note for a knob with no field)."""
    cfg = recipe.config
    lines = []
    if cfg.checkpoint_layers:
        lines.append(
            f"The recipe checkpoints {checkpointed_blocks(recipe)} only; "
            "TrainingArguments checkpoints every block, recomputing more."
        )
    if cfg.compile_mode != "none" and cfg.compile_scope == "model":
        lines.append("The recipe compiles the whole model, as Trainer's torch_compile does.")
    elif cfg.compile_mode != "none":
        lines.append(f"The recipe compiles {compiled_scope(recipe)}; Trainer's torch_compile compiles the whole model.")
    ranks = recipe.world_size
    if cfg.checkpoint_layers or (cfg.compile_mode != "none" and cfg.compile_scope != "model"):
        lines.append(
            "For exactly what the recipe does, call "
            + ("recipe.apply_to_model(model, wrap=False)" if ranks > 1 else "recipe.apply_to_model(model)")
            + " and hf.training_arguments(recipe, model_applied=True)"
            + (" (Trainer wraps or shards over the ranks itself)." if ranks > 1 else ".")
        )
    lines.append('Attention: load the model with attn_implementation="sdpa" (PyTorch scaled_dot_product_attention).')
    if ranks > 1:
        lines.append(
            f"The recipe trains on {ranks} ranks ({cfg.parallelism}): launch the script with torchrun --standalone "
            f"--nproc-per-node {ranks} (autotune export --format torchrun), and Trainer trains over them."
        )
    if recipe.global_batch_tokens is not None and ranks > 1:
        lines.append(
            f"Global batch: {recipe.global_batch_tokens} tokens per optimizer step, {recipe.accumulation_steps} "
            f"micro-batches of {cfg.token_budget} (gradient_accumulation_steps) on each of its {ranks} ranks."
        )
    elif recipe.global_batch_tokens is not None:
        lines.append(
            f"Global batch: {recipe.global_batch_tokens} tokens per optimizer step, {recipe.accumulation_steps} "
            f"micro-batches of {cfg.token_budget} (gradient_accumulation_steps), on one device; with N devices, "
            "divide gradient_accumulation_steps by N to keep it."
        )
    return lines + knob_notes("hf_note", "TrainingArguments", View(recipe, Names.for_fields(None)))


class DataCollator:
    """Pads Trainer's features into the batches autotune measures: `input_ids` and `labels`
    (unshifted, -100 at pads, as Hugging Face models take them), right-padded to the longest
    item rounded up to a multiple of 16 (64 from a context of 256), so torch.compile sees few
    shapes. A feature is a dict with "input_ids" or a plain sequence of token ids. No
    attention mask: with right padding and causal attention it changes no loss, and given
    one a Hugging Face model cannot use SDPA's is_causal (flash) kernels."""

    def __init__(self, seq_len: int) -> None:
        from autotune.data.batching import default_bucket
        from autotune.model.contract import UNSHIFTED
        from autotune.recipe.training import KeywordCollate

        self.collate = KeywordCollate(seq_len, default_bucket(seq_len), convention=UNSHIFTED)

    def __call__(self, features: Sequence[Any]) -> dict[str, Any]:
        import torch

        items = [torch.as_tensor(f["input_ids"] if isinstance(f, dict) else f, dtype=torch.long) for f in features]
        return self.collate(items)


def data_collator(model: Any = None, *, seq_len: int | None = None) -> DataCollator:
    """A `DataCollator` for Trainer, for `model`'s context (or `seq_len`)."""
    from autotune.model.introspect import context_length_of

    length = seq_len or (context_length_of(model) if model is not None else None)
    if not length:
        raise UsageError("data_collator: give the model (its context is the longest sequence) or seq_len=")
    return DataCollator(int(length))


def RecipeCallback(recipe: Recipe, *, output_dir: str | None = None) -> Any:  # noqa: N802 - reads as the class it makes
    """A `transformers.TrainerCallback` that meters the Trainer's run against `recipe`
    (`recipe.meter.RunMeter`): `Trainer(..., callbacks=[hf.RecipeCallback(recipe)])`. At the end
    of training it logs the one-line verdict and writes the report to autotune_meter.json in
    the run's output_dir (or `output_dir`), from the main process. The class is made on the first
    call, so importing this module does not import transformers."""
    return _callback_class()(recipe, output_dir)


@functools.cache
def _callback_class() -> type:
    from transformers import TrainerCallback

    from autotune.integrations.common import finish_meter
    from autotune.recipe.meter import RunMeter

    class RecipeCallback(TrainerCallback):
        """Trainer's hooks to the meter: train begin makes it over the model (each forward's
        labels counted: the step hooks are not handed the batch), step begin is the batch in
        hand (Trainer fetched it just before), step end is the step's end (after the optimizer's)."""

        def __init__(self, recipe: Recipe, output_dir: str | None) -> None:
            self.recipe, self.output_dir = recipe, output_dir
            self.meter: RunMeter | None = None

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            self.meter = RunMeter(self.recipe, model)
            if model is not None:
                self.meter.count_forwards(model)

        def on_step_begin(self, args, state, control, **kwargs):
            if self.meter is not None:
                self.meter.begin()

        def on_step_end(self, args, state, control, **kwargs):
            if self.meter is not None:
                self.meter.step()

        def on_train_end(self, args, state, control, **kwargs):
            if self.meter is not None:
                where = (self.output_dir or args.output_dir) if state.is_world_process_zero else None
                finish_meter(self.meter, where, log)

    return RecipeCallback
