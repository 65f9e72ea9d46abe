"""The recipe: the best configuration a study found, in a versioned file the user takes home.

Format `autotune.recipe` version 1 (JSON, read as strict JSON; a .yaml or .yml file is read as
YAML, safe loader only):

    format, version            "autotune.recipe", 1
    task                       "generate" for a generation recipe (absent: "train")
    config                     every knob of the task (TrainConfig, or GenerateConfig), checkpoint_layers as
                               explicit indices
    workload                   a generation recipe's: prompt lengths (min, max, mean, the list), new_tokens,
                               agree_tokens (`search.generate`)
    batch                      micro_batch_tokens (= config.token_budget), accumulation_steps,
                               world_size, global_batch_tokens (null: one micro-batch per optimizer
                               step); micro_batch_tokens x accumulation_steps x world_size is the
                               global batch. world_size: the ranks it was measured with (torchrun
                               --nproc-per-node), each taking its own micro-batches; absent: 1, one
                               process (config.parallelism none; ddp or fsdp2 with more than one).
                               A recipe without the section (older) accumulates nothing, on one rank
    model                      name, seq_len, n_layer, vocab_size, non_embedding_params
    data                       the data spec it was measured on (synthetic or a file name)
    measured                   tokens_per_sec, padded_tokens_per_sec, padding_fraction,
                               step_time_median_s, step_time_cv, mfu, peak_memory_bytes,
                               peak_memory_source, memory_limit_bytes, data_wait_fraction,
                               compile_time_s, gpu_utilization, unstable; tokens_per_sec_ci95
                               (95 % interval), joules_per_token, energy_source, energy_note
                               (why there is no energy figure), objective, leaders (the
                               re-measured configurations the winner was chosen among); a generation
                               recipe's tokens_per_sec is output tokens/s, and `generation` holds its
                               own figures (time to first token, per-token latency, the correctness check)
    reference_speedups         {"baseline": x, "checklist": y} (best over each reference trial)
    reference_flags            {"baseline": ["unstable"], ...}: what makes a speedup less than it
                               says (`unstable`: the reference's step times varied beyond the
                               target; `infeasible`: it broke the memory limit); only a flagged
                               reference is listed, and the section is left out when none is
    hardware                   the DeviceInfo of the device it was measured on
    software                   torch, optuna, autotune, python versions
    study                      name, storage (password redacted), trial number
    created                    ISO 8601 time

Reading one is strict, and never runs anything: safe YAML without anchors, aliases or
duplicate keys, at most 1 MiB of UTF-8, every field of the right type and within bounds, all
refused in one line. The model a recipe names is only built by `verify` and `profile` when it
is one of autotune's own (`gpt2`, ...); a `package.module:factory` there would import and run
code of the recipe author's choosing, so it needs the user's explicit say (see `model_to_run`).

In a training script (the recipe applies itself; see `Recipe.dataloader` for the dataset contract):

    recipe = autotune.Recipe.load("recipes/gpt2-nvidia-h200.json")
    model = recipe.apply_to_model(model)                # TF32 if chosen; checkpoint blocks, compile, DDP/FSDP2
    loader = recipe.dataloader(dataset, for_model=model)  # its context and labels; workers, budget batches
    scaler = recipe.grad_scaler()                       # enabled only for float16
    for i, batch in enumerate(loader):                  # one micro-batch of token_budget positions (this rank's)
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        with recipe.gradient_sync(model, i):            # several ranks: communicate on the step's last only
            with recipe.autocast():                     # AMP dtype (or TF32) and the forced SDPA backend
                output = model(**batch)
            loss = getattr(output, "loss", output)      # .loss (Hugging Face) or the loss itself
            scaler.scale(loss / recipe.accumulation_steps).backward()
        if recipe.optimizer_step_due(i):                # every accumulation_steps-th micro-batch
            scaler.step(optimizer); scaler.update(); optimizer.zero_grad()

A recipe of several ranks (batch.world_size N) runs that loop in each of N processes, launched
by `torchrun --nproc-per-node N` (`autotune export --format torchrun`), after
`torch.distributed.init_process_group()` (and, on GPUs, `torch.cuda.set_device(LOCAL_RANK)`).

In a generation script: `recipe.apply_to_generation(model)` (`recipe.generation`).

Importing this module does not import torch; the training-side methods do, when called.
"""

from __future__ import annotations

import datetime as _dt
import json
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping

import yaml

from autotune import registry
from autotune.config import (
    DEFAULT_AGREE_TOKENS,
    MAX_GLOBAL_BATCH_TOKENS,
    MAX_NPROC_PER_NODE,
    MAX_TOKEN_BUDGET,
    GenerateConfig,
    JsonProblem,
    TrainConfig,
    accumulation_steps,
    check_int,
    check_workload,
    config_class,
    is_finite_number,
    load_json,
    load_yaml,
    read_config_file,
    yaml_problem,
)
from autotune.device.disk import write_text_atomic
from autotune.errors import RecipeEnvironmentWarning, UnsupportedConfig, UsageError, printable
from autotune.measure.measurement import Measurement
from autotune.model.load import is_factory_name
from autotune.study.references import SPEEDUP_FLAGS
from autotune.units import MIN_MEMORY_SIZE, format_bytes

if TYPE_CHECKING:  # torch is imported by the methods that need it, not by `import autotune`
    import contextlib

    import torch
    from torch.utils.data import DataLoader

FORMAT = "autotune.recipe"
FORMAT_VERSION = 1
YAML_SUFFIXES = (".yaml", ".yml")  # read as YAML; every other recipe file as JSON
_KEYS = {
    "format",
    "version",
    "config",
    "batch",
    "model",
    "data",
    "measured",
    "reference_speedups",
    "reference_flags",
    "hardware",
    "software",
    "study",
    "created",
    "task",
    "workload",
}


@dataclass
class Recipe:
    config: TrainConfig | GenerateConfig
    model: dict[str, Any] = field(default_factory=dict)
    data: str = "synthetic"
    measured: dict[str, Any] = field(default_factory=dict)
    reference_speedups: dict[str, float | None] = field(default_factory=dict)
    reference_flags: dict[str, list[str]] = field(default_factory=dict)  # see the module docstring
    hardware: dict[str, Any] = field(default_factory=dict)
    software: dict[str, Any] = field(default_factory=dict)
    study: dict[str, Any] = field(default_factory=dict)
    created: str = ""
    # Positions per optimizer step (padding included), reached by accumulating token_budget
    # micro-batches; None: one micro-batch per optimizer step. Written as the `batch` section.
    global_batch_tokens: int | None = None
    task: str = registry.TRAIN  # what it tunes: training, or text generation ("generate")
    workload: dict[str, Any] = field(default_factory=dict)  # a generation recipe's prompts and new tokens
    # The ranks it was measured with (torchrun --nproc-per-node), one per device: more than one
    # trains with config.parallelism ddp or fsdp2, and the global batch is across all of them.
    # Written in the `batch` section only when more than 1: a one-process recipe reads as before.
    world_size: int = 1
    # The file it was read from (`load`), for messages; not a field: never written, never compared.
    source: ClassVar[str | None] = None

    def __post_init__(self) -> None:
        if self.config.TASK != self.task:
            raise UsageError(f"recipe: a {self.task} recipe with a {type(self.config).__name__}")
        check_int("world_size", self.world_size, minimum=1, maximum=MAX_NPROC_PER_NODE)
        _check_ranks(self.config, self.world_size, where="recipe")
        if self.global_batch_tokens is not None:
            check_int("global_batch_tokens", self.global_batch_tokens, minimum=1, maximum=MAX_GLOBAL_BATCH_TOKENS)
            try:
                accumulation_steps(self.global_batch_tokens, self.config.token_budget, self.world_size)
            except UnsupportedConfig as exc:
                raise UsageError(f"recipe: {exc}") from None
        _check_run(self.config, self.accumulation_steps if self.task == registry.TRAIN else 1, where="recipe")

    # --- the global batch ------------------------------------------------------------------

    @property
    def micro_batch_tokens(self) -> int:
        """Positions per micro-batch (padding included): the config's token budget."""
        return self.config.token_budget

    @property
    def accumulation_steps(self) -> int:
        """Micro-batches per optimizer step on each rank: global_batch_tokens // (token_budget x
        world_size), else 1."""
        return accumulation_steps(self.global_batch_tokens, self.config.token_budget, self.world_size)

    def optimizer_step_due(self, micro_step: int) -> bool:
        """Whether the optimizer steps after micro-batch `micro_step` (counted from 0): after
        every accumulation_steps-th. Divide each micro-batch's loss by accumulation_steps."""
        return (micro_step + 1) % self.accumulation_steps == 0

    def batch_section(self) -> dict[str, Any]:
        section: dict[str, Any] = {
            "micro_batch_tokens": self.micro_batch_tokens,
            "accumulation_steps": self.accumulation_steps,
        }
        if self.world_size > 1:  # one rank: the section reads as it always has
            section["world_size"] = self.world_size
        section["global_batch_tokens"] = self.global_batch_tokens
        return section

    # --- files -----------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["config"] = self.config.to_dict()
        if self.task == registry.TRAIN and self.config.parallelism == "none":
            # one process: the multi-rank knobs are all at their defaults, and the recipe reads as it always has
            data["config"] = {k: v for k, v in data["config"].items() if not registry.knob(k).ranks_only}
        del data["global_batch_tokens"], data["world_size"]  # both in the batch section
        if not self.reference_flags:  # nothing flagged: the file stays readable by an autotune without the section
            del data["reference_flags"]
        if self.task == registry.TRAIN:  # a training recipe reads as it always has: no task, no workload
            del data["task"], data["workload"]
            data["batch"] = self.batch_section()  # last: the sections before it keep their places
        data["study"] = _redacted(data["study"])  # never a password in a file or an export
        # Through JSON: plain types only (torch.__version__ is a str subclass that
        # yaml.safe_dump refuses; tuples become lists), whatever the fields were built from.
        return json.loads(json.dumps({"format": FORMAT, "version": FORMAT_VERSION, **data}))

    def save(self, path: str | Path) -> Path:
        """Write the recipe as JSON, atomically (a kill or a full disk never leaves half a
        recipe, nor a temporary file); a failure is one line (AutotuneError)."""
        return write_text_atomic(path, json.dumps(self.to_dict(), indent=2) + "\n", what="recipe")

    @classmethod
    def load(cls, path: str | Path, *, check_environment: bool = True) -> "Recipe":
        path = Path(path)
        text = read_config_file(path, what=f"recipe {path}")
        try:
            if path.suffix.lower() in YAML_SUFFIXES:
                # A safe loader: !!python/object and every other tag that would construct objects
                # is refused, and so are anchors, aliases and duplicate keys.
                raw = load_yaml(text)
            else:
                # JSON as JSON: YAML 1.1 reads 1e-05 (how json.dumps writes 0.00001) as text.
                raw = load_json(text)
        except yaml.YAMLError as exc:
            raise UsageError(f"recipe {path}: not a valid recipe file ({yaml_problem(exc)})") from None
        except JsonProblem as exc:
            raise UsageError(f"recipe {path}: not a valid recipe file (JSON: {exc})") from None
        recipe = cls.from_dict(raw, where=f"recipe {path}")
        recipe.source = str(path)
        if check_environment:
            recipe.warn_if_elsewhere()
        return recipe

    @classmethod
    def from_dict(cls, raw: Any, *, where: str = "recipe") -> "Recipe":
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise UsageError(f"{where}: not an autotune recipe (expected format: {FORMAT})")
        version = raw.get("version")
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise UsageError(f"{where}: version must be a positive integer, got {version!r}")
        if version > FORMAT_VERSION:
            raise UsageError(
                f"{where}: format version {version} is newer than this autotune reads "
                f"({FORMAT_VERSION}); upgrade autotune"
            )
        unknown = sorted(str(k) for k in set(raw) - _KEYS)
        if unknown:
            raise UsageError(f"{where}: unknown key {unknown[0]!r}")
        if not isinstance(raw.get("config"), dict):
            raise UsageError(f"{where}: config must be a mapping of knobs")
        task = raw.get("task", registry.TRAIN)
        if task not in registry.TASKS:
            raise UsageError(f"{where}: task must be one of {', '.join(registry.TASKS)}, got {_shown(task)}")
        for key in (
            "model",
            "measured",
            "reference_speedups",
            "reference_flags",
            "hardware",
            "software",
            "study",
            "workload",
        ):
            if not isinstance(raw.get(key, {}), dict):
                raise UsageError(f"{where}: {key} must be a mapping")
        for key in ("data", "created"):
            if key in raw and not isinstance(raw[key], str):
                raise UsageError(f"{where}: {key} must be text, got {_shown(raw[key])}")
        config = config_class(task).from_dict(raw["config"], where=f"{where}: config")
        model = raw.get("model", {})
        _check_fields(model, _MODEL_FIELDS, where=f"{where}: model")
        measured = raw.get("measured", {})
        _check_fields(measured, _MEASURED_FIELDS, where=f"{where}: measured")
        _check_memory_limit(measured, where=f"{where}: measured")
        speedups = raw.get("reference_speedups", {})
        _check_fields(speedups, {name: _number for name in speedups}, where=f"{where}: reference_speedups")
        flags = raw.get("reference_flags", {})
        _check_fields(flags, {name: _speedup_flags for name in flags}, where=f"{where}: reference_flags")
        study = _redacted(raw.get("study", {}))  # a hand-made recipe may hold a password
        _check_fields(study, _STUDY_FIELDS, where=f"{where}: study")
        world_size = 1
        if task == registry.TRAIN:
            global_batch, world_size = _global_batch(raw.get("batch", {}), config, where=f"{where}: batch")
            _check_ranks(config, world_size, where=where)
            _check_run(config, accumulation_steps(global_batch, config.token_budget, world_size), where=where)
        else:
            global_batch = None
            _check_workload(raw.get("workload", {}), where=f"{where}: workload")
        return cls(
            config=config,
            model=model,
            data=raw.get("data", "synthetic"),
            measured=measured,
            reference_speedups=speedups,
            reference_flags=flags,
            hardware=raw.get("hardware", {}),
            software=raw.get("software", {}),
            study=study,
            created=raw.get("created", ""),
            global_batch_tokens=global_batch,
            task=task,
            workload=raw.get("workload", {}),
            world_size=world_size,
        )

    # --- running it here ------------------------------------------------------------------

    def model_to_run(self, model: str | None = None, *, allow_import: bool = False) -> str:
        """The model `verify` and `profile` build for this recipe. `model` (the user's own
        --model) comes first. Otherwise the recipe's: one of autotune's models or an `hf:`
        one (built from a config, no module imported) as it is, but a
        `package.module:factory` would import a module and call it, code that whoever wrote
        the recipe chose, so it is refused (UsageError) unless `allow_import` says the user
        trusts it."""
        if model:
            return model
        name = self.model.get("name")
        if not name:
            raise UsageError("the recipe names no model (model.name): give --model")
        if is_factory_name(name) and not allow_import:
            module = name.partition(":")[0]
            raise UsageError(
                f"the recipe names the model {name!r}, which would import and run code from {module!r}: "
                f"if you trust it, pass --model {name} (or --allow-model-import)"
            )
        return name

    # --- in a training script -------------------------------------------------------------

    def environment(self) -> dict[str, str]:
        """The environment to set before CUDA starts (the caching allocator reads it once, at
        its first allocation): PYTORCH_CUDA_ALLOC_CONF with the recipe's expandable_segments,
        stated explicitly as measured, the other options of this process's setting kept.
        Empty for a recipe measured on a CPU without the option (it changes nothing there).
        In a shell: `export NAME='value'`; `autotune export --format env` prints exactly that."""
        import os

        from autotune.knobs.allocator import allocator_env
        from autotune.knobs.process import threads_env

        threads = threads_env(self.config, os.environ)
        if self.hardware.get("kind") != "cuda" and not self.config.expandable_segments:
            return threads
        return {**allocator_env(self.config, os.environ), **threads}

    def apply_to_model(
        self,
        model: "torch.nn.Module",
        block_path: str | None = None,
        device: "str | torch.device | None" = None,
        *,
        wrap: bool = True,
    ) -> "torch.nn.Module":
        """Apply the model-side knobs to `model`, in place, and return the model to train: activation
        checkpointing of the recipe's blocks, then per-block torch.compile, then for a recipe of
        several ranks the DDP wrap or FSDP2's sharding (the one order, torchtitan's, see
        `autotune.knobs`). A tf32 recipe also turns TF32 on here, process-wide, as it was
        measured: for the whole step (forward, backward, optimizer and the kernels compile
        generates), not just inside `autocast()`. Works on any model whose blocks sit in one ModuleList at
        transformer.h, model.layers, layers, blocks (and a few more), or at `block_path`
        ("stack", "encoder.layer"). A block index beyond the model's count is a UsageError:
        the recipe was made for a deeper model. `device`: move the model there first, so
        compile sees the parameters where they will live. State-dict keys do not change.
        A Hugging Face model also runs without its KV cache unless a call asks for one
        (`generate` does): the cache makes compiled blocks recompile per layer and breaks
        checkpointed ones in backward; its config is untouched, so save_pretrained /
        from_pretrained work as before.

        A recipe of several ranks (`world_size` > 1) runs under torchrun with that many ranks,
        the process group initialised: else UsageError, before anything is changed. ddp returns
        the `DistributedDataParallel` wrapper (train it: its `.module` is your model); fsdp2
        shards your model in place (`fully_shard` per block, then the root). Make the optimizer
        after this call. `wrap=False`: checkpointing and compile only, for a framework that wraps
        or shards itself (Lightning's DDPStrategy, Trainer's accelerate)."""
        from autotune.knobs.apply import apply_model_knobs
        from autotune.knobs.precision import set_tf32

        self._require(registry.TRAIN, "apply_to_model")
        config, ranks = self.config, self.world_size
        if ranks > 1 and wrap:
            from autotune.recipe.training import check_ranks

            check_ranks(ranks, config.parallelism, "recipe.apply_to_model")  # before the model is touched
        elif ranks > 1:  # the framework wraps: the knobs of one process, the ranks' at their defaults
            config, ranks = config.with_overrides({"parallelism": "none"}), 1
        if self.config.amp_dtype == "tf32":
            set_tf32(True)
        if device is not None:
            model.to(device)
        return apply_model_knobs(model, config, block_path, world_size=ranks)

    def gradient_sync(self, model: "torch.nn.Module", micro_step: int) -> "contextlib.AbstractContextManager[None]":
        """`with recipe.gradient_sync(model, i):` around micro-batch i's forward and backward
        (counted from 0): over several ranks, gradients are communicated only on the micro-batch
        that completes an optimizer step (`optimizer_step_due(i)`), as autotune measured; the
        others accumulate locally (DDP's no_sync, FSDP2's set_requires_gradient_sync). A model of
        one process: nothing to skip. `model`: what `apply_to_model` returned."""
        from autotune.recipe.training import gradient_sync

        return gradient_sync(model, last=self.optimizer_step_due(micro_step))

    def dataloader(
        self,
        dataset: Any,
        *,
        for_model: "torch.nn.Module | None" = None,
        labels: str | None = None,
        seq_len: int | None = None,
        collate_fn: Callable[[list["torch.Tensor"]], Any] | None = None,
        attention_mask: bool = False,
        seed: int = 0,
    ) -> "DataLoader":
        """A DataLoader with the recipe's workers, prefetch, pinning, persistent workers,
        token budget and batching mode, shaped for your model.

        for_model: the model the batches are for (pass it: it decides what you cannot get
        wrong). Its context is the sequence length, and batches are dicts of its keyword
        arguments, for `model(**batch)`, with the labels it expects: for a Hugging Face model
        (or any model that shifts labels inside its loss) `{"input_ids", "labels"}` with labels
        unshifted, equal to the inputs with -100 at pads; for autotune's GPT and models of the
        model contract (docs/knobs.md, "Your own model"), labels aligned (label t is the target of position t).
        labels: "unshifted" or "aligned", to choose without a model (dict batches). Without
        for_model or labels, batches are `(input_ids, labels)` tuples, aligned.
        seq_len: the widest input, in tokens (at most the model's context). Default: the
        model's context, else the longest document. Never the recipe's: it is the context of
        the model that was tuned, not of this one.
        attention_mask: also yield "attention_mask" (1 at tokens, 0 at pads). Off by default:
        with right padding and causal attention no real token attends to a pad and pad targets
        are -100, so the mask changes no loss, while a Hugging Face model given one builds a
        4-D mask that rules out SDPA's is_causal kernels (flash), which the recipe may force.

        Dataset contract: map-style (`len(dataset)`, `dataset[i]`), item i one whole training
        sequence of token ids, as a list, a NumPy array or a 1-D tensor, of at most seq_len + 1
        tokens (aligned: inputs x[:-1], labels x[1:]) or seq_len tokens (unshifted: inputs x).
        Documents of fewer than 2 tokens (no target) are skipped, counted in one log line.
        Batches are right-padded: inputs with 0, labels with -100 (ignored by cross-entropy).
        Batching: "padded" groups sequences of similar length into batches of at most
        token_budget tokens (padding included); "fixed" takes token_budget // seq_len
        sequences padded to seq_len; "packed" concatenates and cuts windows of seq_len + 1.
        An epoch is the whole data set: every document is packed (the stream is held in memory,
        4 bytes a token; its remainder short of a window is a last, shorter window), and fixed
        or packed rows left after the last full batch make one smaller batch.

        Lengths: when the dataset has a `lengths` attribute (lengths[i] == len(dataset[i]),
        or an upper bound of it) batches are planned from it without reading the data.
        Without one, every item is read once, here, in this process, to learn its length:
        one full pass over the dataset (tokenization included, if __getitem__ tokenizes),
        before training starts. Give large datasets a `lengths` attribute.

        collate_fn: replaces the padding collate; it receives the list of 1-D int64 tensors.
        pin_memory on a machine without CUDA is dropped, with one warning.

        A recipe of several ranks: every rank plans the same epoch (the same `seed` on every
        rank) and takes its share, batches r, r + N, ... of N (the epoch padded by repeating its
        first batches to a multiple of N, as DistributedSampler pads: every rank takes as many
        steps). The rank is the process group's, read when the loader is first iterated (a
        loader made before init_process_group shares too); iterated with no process group, or
        one of another size, it is a UsageError. for_model may be the DDP wrapper."""
        from autotune.recipe.training import recipe_dataloader

        return recipe_dataloader(
            self.config,
            dataset,
            for_model=for_model,
            labels=labels,
            seq_len=seq_len,
            collate_fn=collate_fn,
            attention_mask=attention_mask,
            seed=seed,
            world_size=self.world_size,
        )

    def autocast(self, device_type: str | None = None) -> "contextlib.AbstractContextManager[None]":
        """What each forward pass runs under: autocast to the recipe's AMP dtype and the forced
        SDPA backend. A tf32 recipe turns TF32 on for the process here too (as
        `apply_to_model` does), and leaves it on when the block ends: the backward pass and
        the optimizer step that follow it are two thirds of the step's matmuls.
        device_type: "cuda" when CUDA is available, else "cpu"."""
        from autotune.knobs.apply import training_context
        from autotune.knobs.precision import set_tf32
        from autotune.recipe.training import device_kind

        if self.config.amp_dtype == "tf32":
            set_tf32(True)
        return training_context(device_kind(device_type), self.config)

    def grad_scaler(self, device_type: str | None = None) -> "torch.amp.GradScaler":
        """A GradScaler enabled only for float16 (a disabled one is a no-op), so the
        training step is the same code whatever the dtype."""
        from autotune.knobs.precision import grad_scaler
        from autotune.recipe.training import device_kind

        return grad_scaler(device_kind(device_type), self.config.amp_dtype)

    def meter(self, model: "torch.nn.Module | None" = None, **kwargs: Any) -> Any:
        """A `recipe.meter.RunMeter` for your training loop: what the run reaches against what
        this recipe recorded, and when short, why. `model`: what apply_to_model returned."""
        from autotune.recipe.meter import RunMeter

        self._require(registry.TRAIN, "meter")
        return RunMeter(self, model, **kwargs)

    def apply_to_generation(
        self, model: "torch.nn.Module", *, device: "str | torch.device | None" = None, max_len: int | None = None
    ) -> Any:
        """What to call to generate as the recipe measured (`recipe.generation.TunedGeneration`):
        the model cast to the recipe's dtype; for autotune's GPT its decode loop with the recipe's
        cache, compile and attention kernels; for a transformers model the GenerationConfig fields
        `generate` takes (`.generate_kwargs`). `max_len`: the longest sequence (prompt plus new
        tokens) a static cache must hold, if longer than the recipe's workload."""
        from autotune.recipe.generation import TunedGeneration

        self._require(registry.GENERATE, "apply_to_generation")
        return TunedGeneration(self, model, device=device, max_len=max_len)

    def _require(self, task: str, method: str) -> None:
        if self.task != task:
            other = "apply_to_generation" if self.task == registry.GENERATE else "apply_to_model and dataloader"
            raise UsageError(f"{method}: this is a {self.task} recipe ({self.source or 'no file'}): use {other}")

    # --- provenance --------------------------------------------------------------------------

    def differences_from_here(self, device: str | None = None) -> list[str]:
        """What differs between where the recipe was measured and this environment (torch as
        both record it, `torch_version`)."""
        from autotune.device import describe, resolve_device, torch_version

        diffs = []
        if self.software.get("torch") and self.software["torch"] != torch_version():
            diffs.append(f"torch {self.software['torch']} there, {torch_version()} here")
        try:
            here = describe(resolve_device(device or ("cuda" if self.hardware.get("kind") == "cuda" else "cpu")))
        except UsageError:
            here = None
        there = self.hardware.get("name")
        if there and (here is None or here.name != there):
            diffs.append(f"measured on {there}, running on {here.name if here else 'no such device'}")
        return diffs

    def warn_if_elsewhere(self, device: str | None = None) -> None:
        diffs = self.differences_from_here(device)
        if diffs:  # escaped: the recipe's hardware name and torch version are the file's, whoever wrote it
            warnings.warn(
                printable("this recipe was measured elsewhere: " + "; ".join(diffs)),
                RecipeEnvironmentWarning,
                stacklevel=3,
            )


# --- validation of a recipe read from a file -------------------------------------------------


def _number(value: Any) -> bool:
    return value is None or (is_finite_number(value) and value >= 0)


def _count(value: Any) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)


def _text(value: Any) -> bool:
    return value is None or isinstance(value, str)


def _speedup_flags(value: Any) -> bool:
    return isinstance(value, list) and all(flag in SPEEDUP_FLAGS for flag in value)


def _interval(value: Any) -> bool:
    return value is None or (_numbers(value) and len(value) == 2 and value[0] <= value[1])


def _numbers(value: Any) -> bool:
    return isinstance(value, list) and len(value) <= 1000 and all(_number(v) and v is not None for v in value)


def _model_name(value: Any) -> bool:
    """A model name is one line of text (gpt2, hf:NAME or hf:PATH, package.module:factory): one with
    a line break or another control character is no model's, and would forge lines in the
    commands and exports that show it. The one rule for every command that reads a recipe."""
    return isinstance(value, str) and 0 < len(value) <= 500 and printable(value) == value


_MODEL_FIELDS: dict[str, Callable[[Any], bool]] = {
    "name": _model_name,
    "seq_len": _count,
    "n_layer": _count,
    "vocab_size": _count,
    "non_embedding_params": _count,
}
_MEASURED_FIELDS: dict[str, Callable[[Any], bool]] = {
    "tokens_per_sec": _number,
    "world_size": _count,
    "per_device_tokens_per_sec": _number,
    "straggler_ratio": _number,
    "scaling_efficiency": _number,
    "padded_tokens_per_sec": _number,
    "padding_fraction": _number,
    "step_time_median_s": _number,
    "step_time_cv": _number,
    "mfu": _number,
    "peak_memory_bytes": _count,
    "peak_memory_source": _text,
    "allocator_peak_bytes": _count,
    "allocator_reserved_peak_bytes": _count,
    "window_peak_memory_bytes": _count,
    "memory_margin_bytes": lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool)),
    "memory_headroom": lambda v: v is None or (is_finite_number(v) and 0 <= v < 1),
    "host_peak_memory_bytes": _count,
    "data_wait_fraction": _number,
    "compile_time_s": _number,
    "gpu_utilization": _number,
    "memory_limit_bytes": _count,
    "tokens_per_sec_runs": _numbers,
    "tokens_per_sec_ci95": _interval,
    "padded_tokens_per_sec_ci95": _interval,
    "energy_joules": _number,
    "joules_per_token": _number,
    "energy_source": _text,
    "energy_note": _text,
    "objective": _text,
    "generation": lambda v: v is None or isinstance(v, dict),
}
_STUDY_FIELDS: dict[str, Callable[[Any], bool]] = {"name": _text, "storage": _text, "trial": _count}
_EXPECTED = {
    _number: "a number >= 0 or null",
    _count: "a whole number >= 0 or null",
    _text: "text or null",
    _numbers: "a list of numbers",
    _interval: "[low, high] or null",
    _speedup_flags: "a list of " + " / ".join(SPEEDUP_FLAGS),
    _model_name: "a model name on one line (1 to 500 characters, no control characters)",
}


def _redacted(study: Any) -> Any:
    """The study section with its storage URL's password hidden (as `study.urls.redact` shows it)."""
    if not isinstance(study, Mapping) or not isinstance(study.get("storage"), str):
        return study
    from autotune.study.urls import redact

    return {**study, "storage": redact(study["storage"])}


def _check_fields(section: Mapping[str, Any], fields: Mapping[str, Callable[[Any], bool]], *, where: str) -> None:
    """Known fields must have their type; others (from a newer autotune) are kept as they are."""
    for key, ok in fields.items():
        if key in section and not ok(section[key]):
            expected = _EXPECTED.get(ok, "a valid value")
            # The key too may come from a hand-made file (an unknown speedup's name): one line.
            raise UsageError(f"{where}.{printable(key)}: expected {expected}, got {_shown(section[key])}")


def _global_batch(batch: Any, config: TrainConfig, *, where: str) -> tuple[int | None, int]:
    """The global batch and the world size of a `batch` section, checked against the config:
    micro_batch_tokens is its token_budget, and micro_batch_tokens x accumulation_steps x
    world_size is the global batch (world_size absent: 1)."""
    if not isinstance(batch, Mapping):
        raise UsageError(f"{where}: expected a mapping, got {_shown(batch)}")
    for key, top in (
        ("micro_batch_tokens", MAX_TOKEN_BUDGET),
        ("accumulation_steps", MAX_GLOBAL_BATCH_TOKENS),
        ("global_batch_tokens", MAX_GLOBAL_BATCH_TOKENS),
        ("world_size", MAX_NPROC_PER_NODE),
    ):
        value = batch.get(key)
        if value is not None and not (_count(value) and 1 <= value <= top):
            raise UsageError(f"{where}.{key}: expected a whole number from 1 to {top} or null, got {_shown(value)}")
    micro = batch.get("micro_batch_tokens", config.token_budget)
    steps = batch.get("accumulation_steps")
    total = batch.get("global_batch_tokens")
    ranks = batch.get("world_size") or 1
    if micro is not None and micro != config.token_budget:
        raise UsageError(f"{where}.micro_batch_tokens: {micro}, but config.token_budget is {config.token_budget}")
    if total is None:
        if steps not in (None, 1):
            raise UsageError(f"{where}: accumulation_steps {steps} without a global_batch_tokens")
        return None, ranks
    if steps is not None and steps * config.token_budget * ranks != total:
        on = f" on each of {ranks} ranks" if ranks > 1 else ""
        raise UsageError(
            f"{where}: {steps} micro-batches of {config.token_budget} tokens{on} are not the global batch of {total}"
        )
    try:
        accumulation_steps(total, config.token_budget, ranks)
    except UnsupportedConfig as exc:
        raise UsageError(f"{where}: {exc}") from None
    return total, ranks


def _check_run(config: TrainConfig | GenerateConfig, steps: int, *, where: str) -> None:
    """The knobs can run at the recipe's accumulation (the registry's run rules, as a search
    prunes a trial by them: CUDA graphs, DDP's static_graph)."""
    if config.TASK != registry.TRAIN or steps == 1:
        return
    values, run = config.to_dict(), {"accumulation_steps": steps}
    for knob in registry.knobs_of(registry.TRAIN):
        if knob.run_rule is not None and knob.name != "parallelism" and (why := knob.run_rule(values, run)):
            raise UsageError(
                f"{where}: {knob.name}={registry.value_text(values[knob.name])} with {steps} micro-batches: {why}"
            )


def _check_ranks(config: TrainConfig | GenerateConfig, world_size: int, *, where: str) -> None:
    """The world size and the parallelism agree (the registry's rule for a run's ranks): one
    rank trains with parallelism none, several with ddp or fsdp2. A generation recipe has one."""
    if config.TASK != registry.TRAIN:
        if world_size != 1:
            raise UsageError(f"{where}: a {config.TASK} recipe runs on one rank, not world_size {world_size}")
        return
    rule = registry.knob("parallelism").run_rule
    why = rule(config.to_dict(), {"world_size": world_size}) if rule is not None else None
    if why is not None:
        raise UsageError(f"{where}: world_size {world_size} and parallelism={config.parallelism} disagree: {why}")


# The types of a workload's fields; its counts' bounds are `check_workload`'s.
_WORKLOAD_FIELDS: dict[str, Callable[[Any], bool]] = {
    "prompt_lens": lambda v: isinstance(v, list),
    "prompt_len_max": lambda v: _count(v),
    "prompt_len_min": lambda v: _count(v),
    "prompt_len_mean": _number,
}


def _check_workload(workload: Mapping[str, Any], *, where: str) -> None:
    """A generation recipe's workload: its new tokens and prompt lengths, each of its type and
    within the bounds a search and `verify` hold it to (`check_workload`): refused here, every
    command that reads the recipe refuses it alike (`export` wrote a loop of 1e9 new tokens)."""
    for key in ("new_tokens", "prompt_lens"):
        if key not in workload:
            raise UsageError(f"{where}.{key}: missing (a generation recipe says what it generated)")
    for key, ok in _WORKLOAD_FIELDS.items():
        if key in workload and not ok(workload[key]):
            raise UsageError(f"{where}.{key}: not a valid value, got {_shown(workload[key])}")
    agree = workload.get("agree_tokens", DEFAULT_AGREE_TOKENS)
    try:
        check_workload(workload["prompt_lens"], workload["new_tokens"], agree)
    except UsageError as exc:
        raise UsageError(f"{where}: {exc}") from None


def _check_memory_limit(measured: Mapping[str, Any], *, where: str) -> None:
    limit = measured.get("memory_limit_bytes")
    if limit is not None and limit < MIN_MEMORY_SIZE:
        raise UsageError(
            f"{where}.memory_limit_bytes: {limit} is {format_bytes(limit)}; a memory limit is at least 1 MiB"
        )


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


RECIPE_FIGURES = (
    "tokens_per_sec",
    "padded_tokens_per_sec",
    "padding_fraction",
    "step_time_median_s",
    "step_time_cv",
    "mfu",
    "peak_memory_bytes",  # the worst case: warm-up, the extreme batch shapes and the window
    "window_peak_memory_bytes",  # what the timed window alone drew
    "peak_memory_source",
    "allocator_peak_bytes",
    "allocator_reserved_peak_bytes",
    "data_wait_fraction",
    "compile_time_s",
    "gpu_utilization",
    "host_peak_memory_bytes",
    "unstable",  # step times varied above the CV target: the figures are less sure; verify them
    "tokens_per_sec_ci95",
    "padded_tokens_per_sec_ci95",
    "energy_joules",
    "joules_per_token",
    "energy_source",
    "energy_note",
)


# A run of several ranks also records these (a single process's recipe reads as it always has).
RANK_FIGURES = ("world_size", "per_device_tokens_per_sec", "straggler_ratio")


def recipe_measured(
    measurement: Measurement | None, memory_limit_bytes: int | None, memory_headroom: float | None = None
) -> dict[str, Any]:
    """The figures a recipe records (its `measured` section) from a run's Measurement, with
    the limit, the headroom it was judged with and the margin: limit - worst-case peak
    (negative: over the limit)."""
    out = {k: getattr(measurement, k, None) if measurement is not None else None for k in RECIPE_FIGURES}
    if measurement is not None and measurement.world_size > 1:  # several ranks: tokens_per_sec is global
        out.update({k: getattr(measurement, k) for k in RANK_FIGURES})
    out["memory_limit_bytes"] = memory_limit_bytes
    out["memory_headroom"] = memory_headroom
    peak = out["peak_memory_bytes"]
    out["memory_margin_bytes"] = (
        memory_limit_bytes - peak if memory_limit_bytes is not None and peak is not None else None
    )
    return out
