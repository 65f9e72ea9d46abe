"""Every knob autotune tunes, declared once.

A knob is one `Knob` entry in `KNOBS` below: its name, type, values or range, default and help
line; its rules (with the other knobs, on a device, on a model); where it takes effect; what
role it plays in a search; what an expert prefers per device class; and how it maps to the
training libraries users run (Hugging Face `TrainingArguments`, Lightning). Everything else is
derived from it:

    TrainConfig (autotune.config)      its fields, defaults, validation and `--set` parsing
    search spaces (autotune.space)     which knobs are categorical, integer ranges and bounds
    device and model support           `knobs.support.check_supported`, `check_model_supported`
    applying a configuration           each `Stage`'s hooks, plain functions in their stage's list
                                       (`knobs.process`, `knobs.apply`; a loader knob's: its `loader`)
    the search's reasoning             `role`, `host_only`, `changes_graph`, `prefer`
    exports                            `integrations.hf`, `integrations.lightning`
    the docs' knob tables              `markdown_table()` (docs/knobs.md, docs/generation.md; tests check them)

Adding a knob is one entry in `KNOBS` plus one function with its stage's signature, listed in
that stage's tuple (`Stage` says where; a loader knob's function is the entry's `loader` mapping);
tests/test_registry.py adds a toy knob of each stage that way and sees each take effect in a
measured run, and in `bench --set`, a space file, a recipe, `export` and the docs table.

Torch-free and import-light: the tuner and every study reader import it. Knobs of other tasks
(`task`: generation) and of launchers (multi-GPU training) are declared here as well, each
task's configuration taking the knobs of its own task."""

from __future__ import annotations

import enum
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

# Bounds on what any file or option may ask for, whatever the machine: beyond them a value is a
# typo or an attack (a recipe asking for 10,000 worker processes or a 10^12-token batch), never
# a configuration. What this machine can run is narrower: see `config.check_runnable_here`.
MAX_NUM_WORKERS = 1024
MAX_PREFETCH_FACTOR = 1024
MAX_TOKEN_BUDGET = 1 << 30  # a billion tokens in one step: far beyond any one device
MAX_BLOCK_INDEX = 100_000

MAX_BATCH_SIZE = 4096  # sequences generated together: beyond it a typo, not a configuration
MAX_PROMPT_BUCKET = 1 << 16

TRAIN = "train"
GENERATE = "generate"  # text generation: prefill and a greedy decode loop (autotune.measure.generation)
TASKS = (TRAIN, GENERATE)


class Kind(str, enum.Enum):
    """How a knob's value is typed, parsed and searched."""

    INTEGER = "integer"
    OPTIONAL_INTEGER = "optional integer"  # an integer, or None (null / none)
    BOOLEAN = "boolean"
    CHOICE = "choice"  # one of `choices`, by name
    BLOCKS = "blocks"  # transformer block indices (checkpointing)


class Role(str, enum.Enum):
    """What a knob does to a training step, as the search reasons about it."""

    # DataLoader settings: they matter only when the loop waits for data (a measurement's
    # data_wait_fraction says so), touch host memory only, and change no compiled graph.
    LOADER = "loader"
    # Positions per micro-batch: memory grows about linearly with it, throughput saturates.
    BUDGET = "budget"
    # Recomputation of chosen blocks: a third more compute in each, for their activation memory.
    CHECKPOINT = "checkpoint"
    # Everything else: which kernels, precision and graphs a step runs.
    KERNELS = "kernels"


class Stage(str, enum.Enum):
    """Where a knob takes effect in a run (the order a run sets things up in), and its hook's list."""

    PROCESS = "process"  # the trial process's environment, before CUDA starts: knobs.process.PROCESS_STAGE
    LOADER = "loader"  # the DataLoader and its batches: the entry's `loader` (data.batching.build_dataloader)
    MODEL = "model"  # the model: knobs.apply.MODEL_STAGE
    OPTIMIZER = "optimizer"  # the optimizer's keyword arguments: knobs.apply.OPTIMIZER_STAGE
    STEP = "step"  # the context each forward pass runs in (precision, SDPA backend): knobs.apply.STEP_STAGE


@dataclass(frozen=True)
class Knob:
    """One knob. Rules return None when they hold, else the reason in one line."""

    name: str
    kind: Kind
    default: Any
    about: str  # one line: what it does (docs, `--set` errors)
    stage: Stage
    applied: str  # where it takes effect, as module:function (the docs' "applied in")
    choices: tuple[Any, ...] = ()  # CHOICE: the names a user writes
    low: int = 0  # INTEGER, OPTIONAL_INTEGER, BLOCKS: the least value
    high: int | None = None  # and the most (None: no bound)
    role: Role = Role.KERNELS
    task: str = TRAIN
    # With the other knobs: why this value cannot go with them (TrainConfig refuses it).
    requires: Callable[[Mapping[str, Any]], str | None] | None = None
    # A knob the others make meaningless is reset to its default by `--set` and sampling
    # (prefetch without workers) instead of refused, unless it was set explicitly.
    inactive: Callable[[Mapping[str, Any]], bool] | None = None
    # On a device: (knobs, capabilities) -> why it cannot run there (`knobs.support`).
    device_rule: Callable[[Mapping[str, Any], Any], str | None] | None = None
    # On a model object (duck-typed, no torch): (model, knobs) -> why that model cannot take it.
    model_rule: Callable[[Any, Mapping[str, Any]], str | None] | None = None
    # With the run's settings, not knobs (`config.accumulation_for`: {"accumulation_steps": n,
    # "world_size": ranks, "cpus": this host's usable CPUs}):
    # (knobs, run) -> why this value cannot run so; UnsupportedConfig, a search prunes it.
    run_rule: Callable[[Mapping[str, Any], Mapping[str, Any]], str | None] | None = None
    host_only: bool = False  # moves host memory only: on a GPU it cannot change the device's peak
    # Meaningful only with several ranks (multi-GPU training): at its default whenever
    # parallelism=none, and then left out of a recipe, which reads as it always has.
    ranks_only: bool = False
    changes_graph: bool = True  # changes what torch.compile traces (a cached compile is not reused)
    # What an expert tries first, per device kind ("cuda", "cpu"), most wanted first; a device
    # class of search.priors ("cuda-hopper") overrides its kind's where experts differ there.
    prefer: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    # TrainingArguments fields for a value: (value, view) -> {field: value}; view is an
    # `integrations.hf.View` (the recipe, the installed field names, model_applied).
    hf: Callable[[Any, Any], dict[str, Any]] | None = None
    # What TrainingArguments cannot express of this value, one sentence (None: nothing).
    hf_note: Callable[[Any, Any], str | None] | None = None
    # Lightning Trainer keyword arguments, and the note, the same way (`integrations.lightning`).
    lightning: Callable[[Any, Any], dict[str, Any]] | None = None
    lightning_note: Callable[[Any, Any], str | None] | None = None
    # DataLoader keyword arguments, the loader stage's hook (build_dataloader; Lightning's export):
    # (value, view) -> {kwarg: value}; view has `.cfg` and `.sequences_per_step`.
    loader: Callable[[Any, Any], dict[str, Any]] | None = None
    # Generation knobs: Hugging Face GenerationConfig fields for a value, (value, view) -> {field: value},
    # and what GenerationConfig cannot express of it (`integrations.generation`).
    hf_generate: Callable[[Any, Any], dict[str, Any]] | None = None
    hf_generate_note: Callable[[Any, Any], str | None] | None = None

    @property
    def values_help(self) -> str:
        """What the knob takes, as an error message says it."""
        if self.kind is Kind.CHOICE:
            return " | ".join(self.choices)
        if self.kind is Kind.BOOLEAN:
            return "true or false"
        if self.kind is Kind.BLOCKS:
            return "comma-separated block indices, e.g. 0,1,2 (empty or none for no checkpointing)"
        top = f" to {self.high}" if self.high is not None else " or more"
        return f"an integer from {self.low}{top}" + (", or none" if self.kind is Kind.OPTIONAL_INTEGER else "")

    @property
    def categorical(self) -> bool:
        """Searched by choices only (a name or a truth value), never by a low..high range."""
        return self.kind in (Kind.CHOICE, Kind.BOOLEAN)

    @property
    def integer(self) -> bool:
        return self.kind in (Kind.INTEGER, Kind.OPTIONAL_INTEGER)

    def parse(self, text: str) -> Any:
        """One `--set knob=value` string as the knob's typed value; ValueError when it is not."""
        raw = text.strip()
        if self.kind is Kind.BOOLEAN:
            lowered = raw.lower()
            if lowered in ("true", "1", "yes", "on"):
                return True
            if lowered in ("false", "0", "no", "off"):
                return False
            raise ValueError(raw)
        if self.kind is Kind.CHOICE:
            if raw not in self.choices:
                raise ValueError(raw)
            return raw
        if self.kind is Kind.BLOCKS:
            if raw.lower() in ("", "none"):
                return ()
            layers = tuple(_integer(part) for part in raw.split(","))
            if any(not self.low <= layer <= (self.high or layer) for layer in layers):
                raise ValueError(raw)
            return layers
        if self.kind is Kind.OPTIONAL_INTEGER and raw.lower() in ("none", "null", ""):
            return None
        value = _integer(raw.replace("_", ""))
        if value < self.low or (self.high is not None and value > self.high):
            raise ValueError(raw)
        return value

    def text(self, value: Any) -> str:
        """A value as `--set` spells it: true/false, 0,1,2, none."""
        return value_text(value)

    def check(self, value: Any) -> str | None:
        """Why `value` is not a value of this knob (its type, its choices, its range), else None."""
        if self.kind is Kind.BOOLEAN:
            return None if isinstance(value, bool) else f"{self.name} must be true or false, got {_short(value)}"
        if self.kind is Kind.CHOICE:
            if isinstance(value, str) and value in self.choices:
                return None
            return f"{self.name} must be one of {', '.join(self.choices)}; got {_short(value)}"
        if self.kind is Kind.BLOCKS:
            if not isinstance(value, (tuple, list)):
                return f"{self.name} must be a list of block indices, got {_short(value)}"
            for index in value:
                if (problem := _integer_problem(self.name, index, self.low, self.high)) is not None:
                    return problem
            if len(set(value)) != len(value):
                return f"{self.name} has repeated block indices: {list(value)}"
            return None
        if value is None and self.kind is Kind.OPTIONAL_INTEGER:
            return None
        return _integer_problem(self.name, value, self.low, self.high)


def value_text(value: Any) -> str:
    """A knob value as `--set` and `Knob.parse` spell it: true/false, 0,1,2, none."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return "none" if value is None else str(value)


def _integer(text: str) -> int:
    if len(text) > 40:  # int() of a 5000-digit string raises Python's digit limit, not ValueError
        raise ValueError(text[:40])
    return int(text)


def _integer_problem(name: str, value: Any, low: int, high: int | None) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        return f"{name} must be an integer >= {low}, got {_short(value)}"
    if high is not None and value > high:
        return f"{name} must be an integer <= {high}, got {_short(value)}"
    return None


def _short(value: Any) -> str:
    """A value fit for a one-line error: short, and never Python's digit-limit error for a huge int."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"an integer of about {int(value.bit_length() * 0.30103)} digits"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# --- rules shared by several knobs ----------------------------------------------------------

SDPA_KERNELS = {  # the torch.nn.attention.SDPBackend member each forced backend names
    "math": "MATH",
    "efficient": "EFFICIENT_ATTENTION",
    "flash": "FLASH_ATTENTION",
    "cudnn": "CUDNN_ATTENTION",
}


def _major(caps: Any) -> int:
    return caps.compute_capability[0] if caps.compute_capability else 0


def _needs_workers(name: str) -> Callable[[Mapping[str, Any]], str | None]:
    def rule(k: Mapping[str, Any]) -> str | None:
        if k[name] not in (None, False) and k["num_workers"] == 0:
            if name == "prefetch_factor":
                return "prefetch_factor needs num_workers > 0 (the main process does not prefetch)"
            return f"{name} needs num_workers > 0"
        return None

    return rule


def _workers_per_rank_rule(k: Mapping[str, Any], run: Mapping[str, Any]) -> str | None:
    ranks, cpus = run.get("world_size", 1), run.get("cpus")
    if ranks > 1 and cpus is not None and ranks * (k["num_workers"] + 1) > cpus:
        return (
            f"{ranks} ranks x ({k['num_workers']} workers + the rank itself) = {ranks * (k['num_workers'] + 1)} "
            f"processes would oversubscribe the {cpus} CPUs here: fewer workers per rank"
        )
    return None


def _without_workers(k: Mapping[str, Any]) -> bool:
    return k.get("num_workers", 0) == 0


def _dtype_rule(k: Mapping[str, Any], caps: Any) -> str | None:
    dtype = k["amp_dtype"]
    if caps.kind == "cpu":
        return "tf32 is a CUDA tensor-core format; CPUs have none" if dtype == "tf32" else None
    if dtype in ("bfloat16", "tf32") and _major(caps) < 8:
        return f"{dtype} needs compute capability 8.0 or newer (Ampere)"
    return None


def _sdpa_rule(k: Mapping[str, Any], caps: Any) -> str | None:
    backend = k["sdpa_backend"]
    if caps.kind == "cpu":
        if backend in ("efficient", "cudnn"):
            return f"{backend} attention is a CUDA kernel; on CPU use math or flash"
        return None
    if backend in ("flash", "cudnn"):
        if k["amp_dtype"] not in ("float16", "bfloat16"):
            return f"{backend} attention needs float16 or bfloat16, not {k['amp_dtype']}"
        if _major(caps) < 8:
            return f"{backend} attention needs compute capability 8.0 or newer"
    return None


def _compile_rule(k: Mapping[str, Any], caps: Any) -> str | None:
    mode = k["compile_mode"]
    if caps.kind == "cpu":
        return "reduce-overhead means CUDA graphs, which need a CUDA device" if mode == "reduce-overhead" else None
    if mode != "none" and not caps.has_triton:
        return "torch.compile on CUDA needs triton, which is not installed"
    return None


# The compile modes that replay CUDA graphs (cudagraph trees): reduce-overhead, and max-autotune
# (max-autotune-no-cudagraphs plus CUDA graphs).
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


def _cuda_graph_requires(k: Mapping[str, Any]) -> str | None:
    mode = k["compile_mode"]
    if mode in CUDA_GRAPH_MODES and k["batching"] == "padded":
        # A graph is recorded (and its memory pool kept) for every batch shape it meets.
        return (
            f"compile_mode={mode} replays CUDA graphs, recorded for one batch shape each, and padded batches "
            "vary in width: use batching=packed (or fixed), or compile_mode=default or max-autotune-no-cudagraphs"
        )
    return None


def _cuda_graph_run_rule(k: Mapping[str, Any], run: Mapping[str, Any]) -> str | None:
    mode, steps = k["compile_mode"], run.get("accumulation_steps", 1)
    if mode in CUDA_GRAPH_MODES and steps > 1:
        # The gradients a graph's backward leaves in .grad are its own outputs, which the next
        # micro-batch's replay overwrites: "accessing tensor output of CUDAGraphs that has been
        # overwritten by a subsequent run" (pytorch#169545, open), or wrong accumulated
        # gradients (pytorch#96693).
        return (
            f"{mode} replays CUDA graphs, which overwrite the gradients accumulated over the {steps} micro-batches "
            "of a global batch (pytorch#169545, #96693): use compile_mode=default or max-autotune-no-cudagraphs "
            "with --global-batch-tokens"
        )
    return None


def _compile_scope_requires(k: Mapping[str, Any]) -> str | None:
    if k["compile_scope"] != "blocks" and k["compile_mode"] == "none":
        return f"compile_scope={k['compile_scope']} needs a compile_mode other than none (nothing is compiled)"
    return None


def _document_requires(k: Mapping[str, Any]) -> str | None:
    if k["attention_mask"] != "document":
        return None
    if k["batching"] != "packed":
        # A padded or fixed row holds one document (or a piece of one) followed by pads:
        # causal attention already never crosses a document there.
        return (
            f"attention_mask=document needs batching=packed: a {k['batching']} row holds one "
            "document, so causal attention already stops at its boundary"
        )
    if k["sdpa_backend"] != "auto":
        return (
            "attention_mask=document runs FlexAttention, not scaled_dot_product_attention: "
            f"sdpa_backend={k['sdpa_backend']} would not take effect; leave it at auto"
        )
    return None


def _document_rule(k: Mapping[str, Any], caps: Any) -> str | None:
    if k["attention_mask"] != "document":
        return None
    if caps.kind == "cpu":
        return (
            "document masks run on FlexAttention, which has no backward on CPU in torch 2.13 "
            "(and torch's variable-length attention is CUDA-only): they train on CUDA"
        )
    if not caps.has_triton:
        return "document masks run on FlexAttention, compiled with triton, which is not installed"
    return None


def _pin_rule(k: Mapping[str, Any], caps: Any) -> str | None:
    if k["pin_memory"] and caps.kind == "cpu":
        return "pinned memory only speeds host-to-GPU copies; there is no GPU"
    return None


def _threads_rule(k: Mapping[str, Any], caps: Any) -> str | None:
    if k["cpu_threads"] and caps.kind != "cpu":
        return "cpu_threads sets the threads of a step run on the CPU; a GPU's step runs on the GPU: leave it at 0"
    return None


def _threads_run_rule(k: Mapping[str, Any], run: Mapping[str, Any]) -> str | None:
    threads = k["cpu_threads"]
    if threads and run.get("world_size", 1) > 1:
        return "with several ranks each rank's threads are its share of the CPUs (the launcher's): leave it at 0"
    if threads and threads > run.get("cpus", threads):
        return f"cpu_threads {threads} is more than the {run['cpus']} CPUs this process may run on"
    return None


def _threads_note(v: Any, view: Any) -> str | None:
    return f"Set OMP_NUM_THREADS={v} before Python starts (or call torch.set_num_threads({v}))." if v else None


def _expandable_rule(k: Mapping[str, Any], caps: Any) -> str | None:
    if k["expandable_segments"] and caps.kind == "cpu":
        return "a setting of the CUDA caching allocator; CPU tensors do not use it"
    return None


# Model rules: duck-typed on the model object; autotune's GPT has every seam they look for.


def _head_rule(model: Any, k: Mapping[str, Any]) -> str | None:
    if k["compile_mode"] != "none" and k["compile_scope"] == "blocks+head" and not has_head(model):
        return head_missing(model)
    return None


def has_head(model: Any) -> bool:
    return callable(getattr(model, "head_loss", None))


def head_missing(model: Any) -> str:
    return (
        f"blocks+head cannot find the head of {type(model).__name__}: it compiles a head_loss(hidden, "
        "labels) method (final norm, output projection and loss; autotune's GPT has one); "
        "use compile_scope=blocks or model"
    )


def _loss_rule(model: Any, k: Mapping[str, Any]) -> str | None:
    if k["loss_impl"] == "chunked" and not takes_chunked_loss(model):
        return (
            f"chunked needs the model to compute its loss through a linear_cross_entropy(hidden, weight, "
            f"labels) attribute that autotune can replace (autotune's GPT does), or a transformers causal LM "
            f"(its lm_head over its decoder's hidden states); {type(model).__name__} computes its loss itself"
        )
    return None


def takes_chunked_loss(model: Any) -> bool:
    """The seam, or a transformers causal LM (its head and decoder: `model.hf_loss` gives it the
    seam, and checks there that its logits are that head over the decoder's last hidden state)."""
    model = getattr(model, "_orig_mod", model)
    if callable(getattr(model, "linear_cross_entropy", None)):
        return True
    return callable(getattr(model, "get_output_embeddings", None)) and hasattr(model, "base_model_prefix")


def _document_model_rule(model: Any, k: Mapping[str, Any]) -> str | None:
    if k["attention_mask"] == "document" and not takes_document_ids(model):
        return (
            f"document needs a model whose forward takes document_ids (autotune's GPT does); "
            f"{type(model).__name__}.forward does not"
        )
    return None


def takes_document_ids(model: Any) -> bool:
    try:
        parameters = inspect.signature(model.forward).parameters
    except (TypeError, ValueError, AttributeError):
        return False
    return "document_ids" in parameters


# --- multi-GPU training: the ranks of one launch and how they share gradients ----------------
# `parallelism` says how the ranks of one torchrun launch train one model (`knobs.parallel`);
# the others are DDP's or FSDP2's own, meaningless (inactive, at their defaults) otherwise.

PARALLELISMS = ("none", "ddp", "fsdp2")


def _parallelism_run_rule(k: Mapping[str, Any], run: Mapping[str, Any]) -> str | None:
    ranks, mode = run.get("world_size", 1), k["parallelism"]
    if mode == "none" and ranks > 1:
        return (
            f"{ranks} ranks with parallelism=none would train {ranks} unsynchronised replicas: "
            "use parallelism=ddp or fsdp2"
        )
    if mode != "none" and ranks == 1:
        return f"parallelism={mode} needs more than one rank (--nproc-per-node 2 or more); one rank trains alone"
    return None


def _only_under(mode: str, name: str) -> Callable[[Mapping[str, Any]], str | None]:
    """A knob of one parallelism: any other value than its default needs that parallelism."""

    def rule(k: Mapping[str, Any]) -> str | None:
        if k["parallelism"] != mode and k[name] != BY_NAME[name].default:
            return f"{name} is a setting of {mode}: it needs parallelism={mode} (it is {k['parallelism']})"
        return None

    return rule


def _fsdp2_scaler_requires(k: Mapping[str, Any]) -> str | None:
    if k["parallelism"] == "fsdp2" and k.get("amp_dtype") == "float16":
        # GradScaler's overflow check reads each rank's own gradient shards: one rank may skip a
        # step that the others take, and the replicas part for good
        return (
            "amp_dtype=float16 under parallelism=fsdp2: the GradScaler checks each rank's gradient shards for "
            "overflow alone, so ranks can step differently; use amp_dtype=bfloat16, or parallelism=ddp"
        )
    return None


def _static_graph_run_rule(k: Mapping[str, Any], run: Mapping[str, Any]) -> str | None:
    steps = run.get("accumulation_steps", 1)
    if k["static_graph"] and k["parallelism"] == "ddp" and steps > 1:
        # no_sync() under static_graph: "expect_autograd_hooks_ INTERNAL ASSERT FAILED" on the first
        # backward (seen here, torch 2.13), and once past it gradients silently never all-reduced again
        # (pytorch#187732, accelerate#3679)
        return (
            f"static_graph=true cannot accumulate {steps} micro-batches under no_sync(): DDP's reducer fails its "
            "internal assert (pytorch#143580), or stops all-reducing (pytorch#187732); use static_graph=false with "
            "--global-batch-tokens"
        )
    return None


def _not_under(mode: str) -> Callable[[Mapping[str, Any]], bool]:
    return lambda k: k.get("parallelism", "none") != mode


def _reduce_dtype_rule(k: Mapping[str, Any], caps: Any) -> str | None:
    if k["reduce_dtype"] != "bfloat16":
        return None
    if caps.kind == "cuda" and _major(caps) < 8:
        return "bfloat16 gradient reduction needs compute capability 8.0 or newer (Ampere)"
    return None


def _hf_bucket_cap(value: int, view: Any) -> dict[str, Any]:
    return {"ddp_bucket_cap_mb": value} if view.cfg.parallelism == "ddp" else {}


# The ranks' knobs in other frameworks. Trainer launches nothing itself (torchrun does, `export
# --format torchrun`) and wraps with DDP, or shards with FSDP2 through accelerate, from its own
# fields. Lightning's strategies take the DDP knobs as DistributedDataParallel keywords; its
# FSDPStrategy is FSDP1 (FullyShardedDataParallel), so FSDP2 is ModelParallelStrategy, which
# leaves fully_shard to LightningModule.configure_model (recipe.apply_to_model there). A Lightning
# strategy is written {"class_path", "init_args"} (LightningCLI's form); integrations.lightning
# builds it.


def _hf_parallelism(mode: str, view: Any) -> dict[str, Any]:
    if mode == "ddp":
        # As measured: every parameter has its gradient every step. Trainer's default is True for a
        # model it does not checkpoint (a search of the autograd graph every step).
        return {"ddp_find_unused_parameters": False}
    if mode == "fsdp2":
        on, version = view.names.fsdp
        return {"fsdp": on, "fsdp_config": {version: 2}}
    return {}


def _hf_static_graph(value: bool, view: Any) -> dict[str, Any]:
    if view.cfg.parallelism != "ddp" or not view.names.ddp_static_graph:
        return {}
    return {"ddp_static_graph": value}


def _hf_static_graph_note(value: bool, view: Any) -> str | None:
    if view.cfg.parallelism == "ddp" and value and not view.names.ddp_static_graph:
        return "The recipe sets DDP's static_graph=true, which this transformers' TrainingArguments has no field for."
    return None


def _hf_bucket_view_note(value: bool, view: Any) -> str | None:
    if view.cfg.parallelism == "ddp" and value:
        return (
            "The recipe sets DDP's gradient_as_bucket_view=true, which TrainingArguments has no field for (Trainer "
            "builds DDP's arguments itself): it trains without it, each gradient copied out of its bucket "
            "(more memory)."
        )
    return None


def _hf_reshard(value: bool, view: Any) -> dict[str, Any]:
    return {"fsdp_config": {"reshard_after_forward": value}} if view.cfg.parallelism == "fsdp2" else {}


def _hf_reduce_dtype_note(value: str, view: Any) -> str | None:
    if view.cfg.parallelism != "fsdp2":
        return None
    return (
        f"The recipe reduce-scatters FSDP2's gradients in {value} (float32 parameters under autocast), which "
        "TrainingArguments has no field for: with bf16 or fp16 on, accelerate reduces in that dtype and keeps "
        "the parameters in it too (its MixedPrecisionPolicy), in float32 otherwise."
    )


def _lightning_strategy(view: Any, name: str) -> str:
    return f"{'pytorch_lightning' if view.major_version == 1 else 'lightning.pytorch'}.strategies.{name}"


def _lightning_parallelism(mode: str, view: Any) -> dict[str, Any]:
    ranks = view.recipe.world_size
    if mode == "ddp":
        return {"devices": ranks, "strategy": {"class_path": _lightning_strategy(view, "DDPStrategy"), "init_args": {}}}
    if mode == "fsdp2":
        # data_parallel_size "auto" would be the nodes, and tensor_parallel_size "auto" the devices
        parallel = {"data_parallel_size": ranks, "tensor_parallel_size": 1}
        return {
            "devices": ranks,
            "strategy": {"class_path": _lightning_strategy(view, "ModelParallelStrategy"), "init_args": parallel},
        }
    return {}


def _lightning_parallelism_note(mode: str, view: Any) -> str | None:
    if mode != "fsdp2":
        return None
    return (
        "Lightning's FSDPStrategy shards with FSDP1 (FullyShardedDataParallel), not the FSDP2 (fully_shard) the "
        "recipe measured: ModelParallelStrategy leaves the sharding to LightningModule.configure_model, where "
        "recipe.apply_to_model(self.model) applies fully_shard to each block, then the root, with the recipe's "
        "reshard_after_forward and reduce_dtype."
    )


def _lightning_ddp_keyword(name: str) -> Callable[[Any, Any], dict[str, Any]]:
    """A DDP knob as a DDPStrategy keyword (DDPStrategy passes it to DistributedDataParallel)."""

    def fields(value: Any, view: Any) -> dict[str, Any]:
        return {"strategy": {"init_args": {name: value}}} if view.cfg.parallelism == "ddp" else {}

    return fields


# --- exports: Hugging Face TrainingArguments and Lightning, per knob ------------------------
# `view` is what the integration knows besides the value: `view.cfg` (the whole TrainConfig),
# `view.names` (the installed transformers' field names), `view.model_applied` (the user calls
# recipe.apply_to_model, so Trainer must not checkpoint or compile again) and `view.recipe`.


def _hf_checkpoint(layers: Any, view: Any) -> dict[str, Any]:
    if view.model_applied or not layers:
        return {}
    return {view.names.checkpointing: True, view.names.checkpointing_kwargs: {"use_reentrant": False}}


def _hf_compile(mode: str, view: Any) -> dict[str, Any]:
    if view.model_applied or mode == "none":
        return {}
    return {"torch_compile": True, "torch_compile_mode": mode}


def _hf_batching(batching: str, view: Any) -> dict[str, Any]:
    if batching != "padded":
        return {}
    name, value = view.names.group_by_length
    return {name: value}


def _hf_batching_note(batching: str, view: Any) -> str | None:
    if batching == "padded":
        return (
            f"The recipe batches by token budget ({view.cfg.token_budget} tokens a step, padding included); "
            "grouping by length at a fixed batch size is the closest TrainingArguments comes."
        )
    if batching == "packed":
        return "The recipe packs documents into full windows (no padding): pack the dataset before training."
    return None


def _sdpa_note(backend: str, view: Any) -> str | None:
    if backend == "auto":
        return None
    note = (
        f"The recipe forces the {backend} SDPA backend, which no argument sets: wrap training in "
        "torch.nn.attention.sdpa_kernel (see below)."
    )
    if backend == "flash" and view.recipe.hardware.get("kind") == "cpu":
        note += (
            " A CPU's flash kernel runs no attention dropout (GPT-2 keeps 0.1): recipe.apply_to_model(model) "
            "turns it off, or build the model with attn_pdrop=0 (attention_dropout=0)."
        )
    return note


_LIGHTNING_PRECISION = {"bfloat16": "bf16-mixed", "float16": "16-mixed", "float32": "32-true", "tf32": "32-true"}
_LIGHTNING_1_PRECISION = {"bfloat16": "bf16", "float16": 16, "float32": 32, "tf32": 32}


def _lightning_precision(dtype: str, view: Any) -> dict[str, Any]:
    table = _LIGHTNING_1_PRECISION if view.major_version == 1 else _LIGHTNING_PRECISION
    return {"precision": table[dtype]}


def _explained_elsewhere(value: Any, view: Any) -> str | None:
    """For knobs whose note the integration writes itself, with the others' (checkpoint and
    compile together; the recipe's batches; its environment)."""
    return None


def _loss_note(impl: str, view: Any) -> str | None:
    if impl != "chunked":
        return None
    return (
        "The recipe computes the head and the loss over chunks of tokens (loss_impl=chunked, the full logits "
        "never held), which no argument sets: call recipe.apply_to_model(model), which sets it on autotune's GPT "
        "and on a transformers causal LM (its loss from the decoder's hidden states and lm_head: a training call "
        "with labels then returns .loss and no .logits)."
    )


# --- the knobs of text generation (task "generate") ------------------------------------------
# Rules on generation's own keys, through the training rules where the question is the same (a
# dtype, an SDPA kernel, a compile mode on this device), so each answer is written once.


def _generation_dtype_rule(k: Mapping[str, Any], caps: Any) -> str | None:
    return _dtype_rule({"amp_dtype": k["dtype"]}, caps)


def _generation_sdpa_rule(which: str) -> Callable[[Mapping[str, Any], Any], str | None]:
    def rule(k: Mapping[str, Any], caps: Any) -> str | None:
        why = _sdpa_rule({"sdpa_backend": k[which], "amp_dtype": k["dtype"]}, caps)
        if why is None and which == "decode_sdpa" and caps.kind == "cuda":
            if k[which] == "flash" and k["kv_cache"] == "static":
                return (
                    "flash attention takes no mask, and a static cache's decode step attends over the whole "
                    "preallocated cache through one; use math, efficient or cudnn"
                )
        return why

    return rule


def _decode_compile_rule(k: Mapping[str, Any], caps: Any) -> str | None:
    mode = k["decode_compile"]
    if caps.kind == "cpu" and mode == "reduce-overhead":
        return "reduce-overhead means CUDA graphs, which need a CUDA device"
    return _compile_rule({"compile_mode": mode}, caps)


def _decode_compile_requires(k: Mapping[str, Any]) -> str | None:
    if k["decode_compile"] == "reduce-overhead" and k["kv_cache"] != "static":
        # pytorch #128424, #117106: a graph recorded per length, their pools growing until out of memory
        return (
            "reduce-overhead records a CUDA graph for every shape it meets, and a dynamic cache grows by one "
            "position each token: one graph per length, memory growing with each; use kv_cache=static"
        )
    return None


def _compile_prefill_requires(k: Mapping[str, Any]) -> str | None:
    if k["compile_prefill"] and k["decode_compile"] == "none":
        return "compile_prefill=true compiles prefill with the decode step's mode: set a decode_compile other than none"
    return None


def _without_decode_compile(k: Mapping[str, Any]) -> bool:
    return k.get("decode_compile", "none") == "none"


def generates_with_hf(model: Any) -> bool:
    """A transformers model: it generates through `generate` (GenerationMixin), duck-typed."""
    model = getattr(model, "_orig_mod", model)
    return callable(getattr(model, "generate", None)) and callable(getattr(model, "_valid_auto_compile_criteria", None))


def _hf_static_cache_rule(model: Any, k: Mapping[str, Any]) -> str | None:
    if k["kv_cache"] != "static" or not generates_with_hf(model):
        return None
    supports = getattr(model, "_supports_default_dynamic_cache", None)
    if callable(supports) and not supports():
        return (
            f"{type(model).__name__} keeps a cache of its own, and transformers ignores cache_implementation for it "
            "(GenerationMixin._supports_default_dynamic_cache): it cannot use a static cache"
        )
    return None


def _hf_decode_compile_rule(model: Any, k: Mapping[str, Any]) -> str | None:
    if k["decode_compile"] != "none" and k["kv_cache"] != "static" and generates_with_hf(model):
        return (
            "transformers compiles generate's decode step only with a static cache (GenerationMixin."
            "_valid_auto_compile_criteria): with a dynamic one it would run eager; use kv_cache=static"
        )
    return None


def _hf_compile_prefill_rule(model: Any, k: Mapping[str, Any]) -> str | None:
    if k["compile_prefill"] and generates_with_hf(model):
        return "transformers' generate compiles the decode step only; its prefill runs eager (GenerationMixin._prefill)"
    return None


def _hf_one_sdpa_rule(model: Any, k: Mapping[str, Any]) -> str | None:
    if k["prefill_sdpa"] != k["decode_sdpa"] and generates_with_hf(model):
        return (
            "transformers' generate runs prefill and decode in one call, under one SDPA backend: "
            f"set prefill_sdpa and decode_sdpa alike (now {k['prefill_sdpa']} and {k['decode_sdpa']})"
        )
    return None


def _compile_config(mode: str, view: Any) -> dict[str, Any]:
    # decode_compile=none says so: generate compiles a static cache's decode step on its own on CUDA
    return {"disable_compile": True} if mode == "none" else {"compile_config": {"mode": mode, "fullgraph": False}}


GENERATE_KNOBS: tuple[Knob, ...] = (
    Knob(
        "kv_cache",
        Kind.CHOICE,
        "dynamic",
        "dynamic: keys and values grow a position a token; static: preallocated for the longest prompt plus "
        "the new tokens (one shape for every decode step)",
        Stage.MODEL,
        "autotune.model.kv_cache:make_cache",
        choices=("dynamic", "static"),
        task=GENERATE,
        model_rule=_hf_static_cache_rule,
        prefer={"cuda": ("static", "dynamic"), "cpu": ("static", "dynamic")},
        hf_generate=lambda v, view: {"cache_implementation": "static"} if v == "static" else {},
    ),
    Knob(
        "decode_compile",
        Kind.CHOICE,
        "none",
        "torch.compile's mode for the decode step (none: eager; reduce-overhead: CUDA graphs)",
        Stage.MODEL,
        "autotune.knobs.generation:compile_steps",
        choices=("none", "default", "reduce-overhead", "max-autotune-no-cudagraphs"),
        task=GENERATE,
        requires=_decode_compile_requires,
        device_rule=_decode_compile_rule,
        model_rule=_hf_decode_compile_rule,
        prefer={
            "cuda": ("reduce-overhead", "default", "max-autotune-no-cudagraphs", "none"),
            "cpu": ("none", "default"),
        },
        hf_generate=_compile_config,
    ),
    Knob(
        "compile_prefill",
        Kind.BOOLEAN,
        False,
        "compile prefill too, with the decode step's mode (one graph per padded prompt width)",
        Stage.MODEL,
        "autotune.knobs.generation:compile_steps",
        task=GENERATE,
        requires=_compile_prefill_requires,
        inactive=_without_decode_compile,
        model_rule=_hf_compile_prefill_rule,
        prefer={"cuda": (False, True), "cpu": (False, True)},
    ),
    Knob(
        "prefill_sdpa",
        Kind.CHOICE,
        "auto",
        "the forced scaled_dot_product_attention kernel of prefill (auto: torch's choice)",
        Stage.STEP,
        "autotune.knobs.generation:attention_of",
        choices=("auto", "math", "efficient", "flash", "cudnn"),
        task=GENERATE,
        device_rule=_generation_sdpa_rule("prefill_sdpa"),
        model_rule=_hf_one_sdpa_rule,
        prefer={"cuda": ("flash", "cudnn", "efficient", "auto", "math"), "cpu": ("auto", "flash", "math")},
        hf_generate_note=lambda v, view: (
            f"The recipe forces the {v} SDPA backend, which no GenerationConfig field sets: load the model with "
            'attn_implementation="sdpa" and call generate inside torch.nn.attention.sdpa_kernel (see below).'
            if v != "auto"
            else None
        ),
    ),
    Knob(
        "decode_sdpa",
        Kind.CHOICE,
        "auto",
        "the forced scaled_dot_product_attention kernel of each decode step: one query token (auto: torch's choice)",
        Stage.STEP,
        "autotune.knobs.generation:attention_of",
        choices=("auto", "math", "efficient", "flash", "cudnn"),
        task=GENERATE,
        device_rule=_generation_sdpa_rule("decode_sdpa"),
        # one query token: math is often as fast as a fused kernel (gpt-fast decodes through math)
        prefer={"cuda": ("auto", "math", "efficient", "cudnn", "flash"), "cpu": ("auto", "math", "flash")},
    ),
    Knob(
        "dtype",
        Kind.CHOICE,
        "float32",
        "the weights' and the cache's dtype (the model is cast, as inference runs it)",
        Stage.MODEL,
        "autotune.knobs.generation:cast_model",
        choices=("float32", "float16", "bfloat16"),
        task=GENERATE,
        device_rule=_generation_dtype_rule,
        prefer={"cuda": ("bfloat16", "float16", "float32"), "cpu": ("float32", "bfloat16")},
        hf_generate_note=lambda v, view: (
            f"Load the model in {v}: from_pretrained(..., dtype=torch.{v}), or model.to(torch.{v})."
            if v != "float32"
            else None
        ),
    ),
    Knob(
        "batch_size",
        Kind.INTEGER,
        1,
        "prompts generated together (output tokens/s counts every sequence of the batch)",
        Stage.LOADER,
        "autotune.measure.generation:workload_batches",
        low=1,
        high=MAX_BATCH_SIZE,
        role=Role.BUDGET,
        task=GENERATE,
        prefer={"cuda": (8, 4, 16, 1), "cpu": (1, 4)},
        hf_generate_note=lambda v, view: (
            f"Generate {v} prompts a call (input_ids of shape ({v}, width))." if v > 1 else None
        ),
    ),
    Knob(
        "prompt_bucket",
        Kind.INTEGER,
        1,
        "prompts left-padded to a multiple of this many tokens (1: to the batch's longest), so compiled "
        "prefill meets few widths",
        Stage.LOADER,
        "autotune.measure.generation:workload_batches",
        low=1,
        high=MAX_PROMPT_BUCKET,
        task=GENERATE,
        prefer={"cuda": (64, 16, 1), "cpu": (1, 16)},
        hf_generate_note=lambda v, view: (
            f"Pad prompts on the left to a multiple of {v}: tokenizer(..., padding=True, pad_to_multiple_of={v}, "
            'padding_side="left").'
            if v > 1
            else None
        ),
    ),
)

# --- the knobs ---------------------------------------------------------------------------------

KNOBS: tuple[Knob, ...] = (
    *GENERATE_KNOBS,  # first: the training knobs that follow end the tuple, where a new one is added
    Knob(
        "num_workers",
        Kind.INTEGER,
        0,
        "DataLoader worker processes",
        Stage.LOADER,
        "autotune.data.batching:build_dataloader",
        low=0,
        high=MAX_NUM_WORKERS,
        role=Role.LOADER,
        run_rule=_workers_per_rank_rule,
        host_only=True,
        changes_graph=False,
        prefer={"cuda": (4, 8, 2, 0), "cpu": (0, 1, 2)},
        hf=lambda v, view: {"dataloader_num_workers": v},
        loader=lambda v, view: {"num_workers": v},
    ),
    Knob(
        "prefetch_factor",
        Kind.OPTIONAL_INTEGER,
        None,
        "batches each DataLoader worker loads ahead",
        Stage.LOADER,
        "autotune.data.batching:build_dataloader",
        low=1,
        high=MAX_PREFETCH_FACTOR,
        role=Role.LOADER,
        requires=_needs_workers("prefetch_factor"),
        inactive=_without_workers,
        host_only=True,
        changes_graph=False,
        prefer={"cuda": (4, 2, 8)},
        # refused by TrainingArguments without workers
        hf=lambda v, view: {"dataloader_prefetch_factor": v} if v is not None and view.cfg.num_workers else {},
        loader=lambda v, view: {"prefetch_factor": v if view.cfg.num_workers > 0 else None},
    ),
    Knob(
        "pin_memory",
        Kind.BOOLEAN,
        False,
        "page-locked host batches; copies to the GPU are non_blocking",
        Stage.LOADER,
        "autotune.data.batching:build_dataloader",
        role=Role.LOADER,
        device_rule=_pin_rule,
        host_only=True,
        changes_graph=False,
        prefer={"cuda": (True, False), "cpu": (False,)},
        hf=lambda v, view: {"dataloader_pin_memory": v},  # TrainingArguments' default is True: always say it
        loader=lambda v, view: {"pin_memory": v},
    ),
    Knob(
        "persistent_workers",
        Kind.BOOLEAN,
        False,
        "DataLoader workers kept alive across epochs",
        Stage.LOADER,
        "autotune.data.batching:build_dataloader",
        role=Role.LOADER,
        requires=_needs_workers("persistent_workers"),
        inactive=_without_workers,
        host_only=True,
        changes_graph=False,
        prefer={"cuda": (True, False)},
        hf=lambda v, view: {"dataloader_persistent_workers": v},
        loader=lambda v, view: {"persistent_workers": v},
    ),
    Knob(
        "token_budget",
        Kind.INTEGER,
        8192,
        "positions per micro-batch, padding included (per optimizer step too, unless --global-batch-tokens "
        "fixes a global batch)",
        Stage.LOADER,
        "autotune.data.batching:build_dataloader",
        low=1,
        high=MAX_TOKEN_BUDGET,
        role=Role.BUDGET,
        # the micro-batch's sequences (Trainer steps the optimizer every gradient_accumulation_steps)
        hf=lambda v, view: {"per_device_train_batch_size": view.sequences_per_step},
        loader=lambda v, view: {"batch_size": view.sequences_per_step},
    ),
    Knob(
        "batching",
        Kind.CHOICE,
        "padded",
        "padded: length-grouped token-budget batches; packed: contiguous windows; fixed: the baseline's "
        "full-length rows",
        Stage.LOADER,
        "autotune.data.batching:build_dataloader",
        choices=("fixed", "padded", "packed"),
        prefer={"cuda": ("packed", "padded"), "cpu": ("packed", "padded")},
        hf=_hf_batching,
        hf_note=_hf_batching_note,
        lightning_note=_explained_elsewhere,  # recipe.dataloader gives its batches (lightning.notes)
    ),
    Knob(
        "amp_dtype",
        Kind.CHOICE,
        "float32",
        "float32, tf32 (TF32 matmuls for the whole step), float16 (with a GradScaler) or bfloat16 autocast",
        Stage.STEP,
        "autotune.knobs.precision:precision",
        choices=("float32", "tf32", "float16", "bfloat16"),
        device_rule=_dtype_rule,
        # bf16 autocast is what every modern recipe trains in (nanoGPT, modded-nanogpt, llm.c); fp16
        # (with a GradScaler) before Ampere. On a CPU without bf16 units bf16 is emulated: float32.
        prefer={"cuda": ("bfloat16", "float16", "tf32", "float32"), "cpu": ("float32", "bfloat16")},
        hf=lambda v, view: {"bf16": v == "bfloat16", "fp16": v == "float16", **({"tf32": True} if v == "tf32" else {})},
        lightning=_lightning_precision,
        lightning_note=lambda v, view: (
            'tf32: float32 weights, TF32 tensor-core matmuls: torch.set_float32_matmul_precision("high").'
            if v == "tf32"
            else None
        ),
    ),
    Knob(
        "compile_mode",
        Kind.CHOICE,
        "none",
        "torch.compile's mode (none: eager)",
        Stage.MODEL,
        "autotune.knobs.compile:apply_compile_knob",
        choices=("none", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"),
        requires=_cuda_graph_requires,
        device_rule=_compile_rule,
        run_rule=_cuda_graph_run_rule,
        # default compiles in tens of seconds; max-autotune in minutes per trial
        prefer={
            "cuda": ("default", "max-autotune-no-cudagraphs", "reduce-overhead", "max-autotune", "none"),
            "cpu": ("none", "default"),
        },
        hf=_hf_compile,
        hf_note=_explained_elsewhere,
        lightning_note=_explained_elsewhere,
    ),
    Knob(
        "compile_scope",
        Kind.CHOICE,
        "blocks",
        "what torch.compile covers: each block; each block and the head (norm, lm_head, loss); the whole model",
        Stage.MODEL,
        "autotune.knobs.compile:apply_compile_knob",
        choices=("blocks", "blocks+head", "model"),
        requires=_compile_scope_requires,
        model_rule=_head_rule,
        # The head and the loss hold 31 % of GPT-2 124M's matmul FLOPs; blocks+head keeps compile
        # time flat in depth (one block graph), where a whole-model graph does not.
        prefer={"cuda": ("blocks+head", "model", "blocks"), "cpu": ("blocks", "blocks+head", "model")},
        hf_note=_explained_elsewhere,
        lightning_note=_explained_elsewhere,
    ),
    Knob(
        "sdpa_backend",
        Kind.CHOICE,
        "auto",
        "the forced scaled_dot_product_attention kernel (auto: torch's choice)",
        Stage.STEP,
        "autotune.knobs.precision:sdpa_backend",  # what the kernel assumes of the model: knobs.attention
        choices=("auto", "math", "efficient", "flash", "cudnn"),
        device_rule=_sdpa_rule,
        # FlashAttention-2 (Dao 2023); on Hopper cuDNN first: up to 75 % faster than FlashAttention-2
        # on H100 (PyTorch 2.5 release notes), as search.priors says there
        prefer={
            "cuda": ("flash", "cudnn", "efficient", "auto", "math"),
            "cuda-hopper": ("cudnn", "flash", "efficient", "auto", "math"),
            "cpu": ("flash", "math"),
        },
        hf_note=_sdpa_note,
        lightning_note=_sdpa_note,
    ),
    Knob(
        "loss_impl",
        Kind.CHOICE,
        "standard",
        "standard: logits then cross-entropy; chunked: head and loss over chunks, the full logits never held",
        Stage.MODEL,
        "autotune.knobs.loss:apply_loss_knob",
        choices=("standard", "chunked"),
        model_rule=_loss_rule,
        prefer={"cuda": ("standard", "chunked"), "cpu": ("standard", "chunked")},
        hf_note=_loss_note,
        lightning_note=_loss_note,
    ),
    Knob(
        "attention_mask",
        Kind.CHOICE,
        "causal",
        "causal; document: packed windows whose attention stops at document boundaries (FlexAttention)",
        Stage.MODEL,
        "autotune.data.batching:DocumentCollate",
        choices=("causal", "document"),
        requires=_document_requires,
        device_rule=_document_rule,
        model_rule=_document_model_rule,
        prefer={"cuda": ("causal", "document"), "cpu": ("causal",)},
    ),
    Knob(
        "checkpoint_layers",
        Kind.BLOCKS,
        (),
        "blocks whose activations are recomputed in backward (non-reentrant checkpointing)",
        Stage.MODEL,
        "autotune.knobs.checkpoint:apply_checkpoint_knob",
        low=0,
        high=MAX_BLOCK_INDEX,
        role=Role.CHECKPOINT,
        prefer={"cuda": ((),), "cpu": ((),)},  # experts checkpoint only to fit a larger budget
        hf=_hf_checkpoint,
        hf_note=_explained_elsewhere,
        lightning_note=_explained_elsewhere,
    ),
    Knob(
        "expandable_segments",
        Kind.BOOLEAN,
        False,
        "the CUDA caching allocator's expandable_segments (PYTORCH_CUDA_ALLOC_CONF), set before CUDA starts",
        Stage.PROCESS,
        "autotune.knobs.allocator:allocator_env",  # where CUDA already runs, the model stage sets it
        device_rule=_expandable_rule,
        changes_graph=False,
        prefer={"cuda": (False, True), "cpu": (False,)},
        hf_note=lambda v, view: (
            "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before CUDA starts." if v else None
        ),
    ),
    Knob(
        "cpu_threads",
        Kind.INTEGER,
        0,
        "the threads a step on the CPU runs its operators on (torch.set_num_threads, OMP_NUM_THREADS); "
        "0: PyTorch's default, one per core, which a busy host can make many times slower",
        Stage.PROCESS,
        "autotune.knobs.process:threads_env",  # in a running process, the model stage sets it
        low=0,
        high=MAX_NUM_WORKERS,
        device_rule=_threads_rule,
        run_rule=_threads_run_rule,
        host_only=True,
        changes_graph=False,
        prefer={"cuda": (0,), "cpu": (0, 1)},
        hf_note=_threads_note,
        lightning_note=_threads_note,
    ),
    Knob(
        "parallelism",
        Kind.CHOICE,
        "none",
        "how the ranks of one launch (--nproc-per-node N) train the model: none (one process), ddp "
        "(DistributedDataParallel) or fsdp2 (fully_shard per block and the root)",
        Stage.MODEL,
        "autotune.knobs.parallel:apply_parallel_knob",
        choices=PARALLELISMS,
        requires=_fsdp2_scaler_requires,
        run_rule=_parallelism_run_rule,
        ranks_only=True,
        # DDP first where the model fits: 8,034 against FSDP's 1,747 tokens/s per device for a 1B
        # model on 4 GPUs (OLMo #762); FSDP2 pays only when memory forces it
        prefer={"cuda": ("ddp", "fsdp2"), "cpu": ("ddp", "fsdp2")},
        hf=_hf_parallelism,
        lightning=_lightning_parallelism,
        lightning_note=_lightning_parallelism_note,
    ),
    Knob(
        "bucket_cap_mb",
        Kind.INTEGER,
        25,
        "DDP's gradient bucket size in MiB: gradients are all-reduced a bucket at a time, overlapping backward",
        Stage.MODEL,
        "autotune.knobs.parallel:apply_parallel_knob",
        low=1,
        high=4096,
        requires=_only_under("ddp", "bucket_cap_mb"),
        inactive=_not_under("ddp"),
        ranks_only=True,
        # PyTorch's maintainers call 25 small and suggest 100 (pytorch#118421); under compile the
        # buckets are where DDPOptimizer splits the graph
        prefer={"cuda": (100, 25, 50, 200), "cpu": (25, 100)},
        hf=_hf_bucket_cap,
        lightning=_lightning_ddp_keyword("bucket_cap_mb"),
    ),
    Knob(
        "gradient_as_bucket_view",
        Kind.BOOLEAN,
        False,
        "DDP: gradients are views into the all-reduce buckets (no copy, less memory)",
        Stage.MODEL,
        "autotune.knobs.parallel:apply_parallel_knob",
        requires=_only_under("ddp", "gradient_as_bucket_view"),
        inactive=_not_under("ddp"),
        ranks_only=True,
        changes_graph=False,
        prefer={"cuda": (True, False), "cpu": (True, False)},
        hf_note=_hf_bucket_view_note,
        lightning=_lightning_ddp_keyword("gradient_as_bucket_view"),
    ),
    Knob(
        "static_graph",
        Kind.BOOLEAN,
        False,
        "DDP: the set of used parameters is the same every step, so DDP plans its buckets once",
        Stage.MODEL,
        "autotune.knobs.parallel:apply_parallel_knob",
        requires=_only_under("ddp", "static_graph"),
        inactive=_not_under("ddp"),
        run_rule=_static_graph_run_rule,
        ranks_only=True,
        changes_graph=False,
        prefer={"cuda": (True, False), "cpu": (True, False)},
        hf=_hf_static_graph,
        hf_note=_hf_static_graph_note,
        lightning=_lightning_ddp_keyword("static_graph"),
    ),
    Knob(
        "reshard_after_forward",
        Kind.BOOLEAN,
        True,
        "FSDP2: free each block's gathered parameters after its forward (gathered again in backward)",
        Stage.MODEL,
        "autotune.knobs.parallel:apply_parallel_knob",
        requires=_only_under("fsdp2", "reshard_after_forward"),
        inactive=_not_under("fsdp2"),
        ranks_only=True,
        changes_graph=False,
        hf=_hf_reshard,
        # False: about +8 % in torchtune #2402, for the memory of every block's full parameters
        prefer={"cuda": (False, True), "cpu": (False, True)},
    ),
    Knob(
        "reduce_dtype",
        Kind.CHOICE,
        "float32",
        "FSDP2: the dtype gradients are reduce-scattered in (MixedPrecisionPolicy's reduce_dtype)",
        Stage.MODEL,
        "autotune.knobs.parallel:apply_parallel_knob",
        choices=("float32", "bfloat16"),
        requires=_only_under("fsdp2", "reduce_dtype"),
        inactive=_not_under("fsdp2"),
        device_rule=_reduce_dtype_rule,
        ranks_only=True,
        changes_graph=False,
        hf_note=_hf_reduce_dtype_note,
        prefer={"cuda": ("float32", "bfloat16"), "cpu": ("float32",)},
    ),
)

BY_NAME: dict[str, Knob] = {k.name: k for k in KNOBS}


def knob(name: str) -> Knob:
    return BY_NAME[name]


BY_TASK: dict[str, tuple[Knob, ...]] = {t: tuple(k for k in KNOBS if k.task == t) for t in {k.task for k in KNOBS}}


def knobs_of(task: str = TRAIN) -> tuple[Knob, ...]:
    # Made once: every config's validation asks for them, and the planner builds tens of thousands.
    return BY_TASK.get(task, ())


def names(task: str = TRAIN) -> tuple[str, ...]:
    return tuple(k.name for k in knobs_of(task))


def markdown_table(task: str = TRAIN) -> str:
    """The knob table of docs/knobs.md (docs/generation.md for a generation task), from the registry."""
    rows = ["| knob | values | default | what it does | applied in |", "|---|---|---|---|---|"]
    for k in knobs_of(task):
        values = k.values_help.replace("|", "\\|")
        rows.append(
            f"| `{k.name}` | {values} | `{value_text(k.default) or 'none'}` | {k.about} | "
            f"`{k.applied.replace(':', '.')}` |"
        )
    return "\n".join(rows)
