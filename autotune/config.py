"""Typed, validated configurations: the knobs of one training run (`TrainConfig`) and
what is run (`RunSpec`). Both are frozen values, validated once when built from the CLI,
a YAML space, a recipe or an Optuna trial; every other module can trust them.

Also here, because spaces and recipes are both read through it: the one YAML reader for
files a user hands us (`read_config_file`, `load_yaml`), stricter than `yaml.safe_load`."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from autotune import environment, registry
from autotune.device.info import usable_cpus
from autotune.errors import UnsupportedConfig, UsageError

IGNORE_INDEX = -100  # the label of a pad position in every batch autotune makes: cross-entropy skips it

# The choices of the categorical knobs, as the registry declares them.
AMP_DTYPES = registry.knob("amp_dtype").choices
COMPILE_MODES = registry.knob("compile_mode").choices
COMPILE_SCOPES = registry.knob("compile_scope").choices
LOSS_IMPLS = registry.knob("loss_impl").choices
ATTENTION_MASKS = registry.knob("attention_mask").choices
SDPA_BACKENDS = registry.knob("sdpa_backend").choices
SDPA_KERNELS = registry.SDPA_KERNELS
BATCHING_MODES = registry.knob("batching").choices
DEVICE_KINDS = ("cpu", "cuda")

MAX_NUM_WORKERS = registry.MAX_NUM_WORKERS
MAX_PREFETCH_FACTOR = registry.MAX_PREFETCH_FACTOR
MAX_TOKEN_BUDGET = registry.MAX_TOKEN_BUDGET
MAX_BLOCK_INDEX = registry.MAX_BLOCK_INDEX
# A global batch of at most this many micro-batches' worth: llama-scale runs use 4M tokens a
# step; 2^32 positions is far beyond any configuration, never a reason to loop forever.
MAX_GLOBAL_BATCH_TOKENS = 1 << 32
MAX_STEPS = 1_000_000  # --steps and --warmup
MAX_MIN_TIME_S = 3600.0  # --min-time: an hour of timed steps is already a benchmark, not a trial
MAX_SEQ_LEN = 1 << 20  # --seq-len: 1M positions, beyond any GPT-2-class context (the model's is checked too)
MAX_SEED = 2**32 - 1  # numpy's generators take seeds in [0, 2**32)
# Ranks on one host: one per device, and no host has more than a few dozen.
MAX_NPROC_PER_NODE = 256
# DataLoader workers are processes: more than a few per CPU only adds memory and scheduling.
# At most this many per usable CPU (and never fewer than WORKERS_FLOOR, so the shipped spaces
# and the checklist's 4 workers run on a small machine); AUTOTUNE_MAX_NUM_WORKERS overrides.
WORKERS_PER_CPU = 4
WORKERS_FLOOR = 8
MAX_WORKERS_ENV = environment.MAX_NUM_WORKERS

KNOBS: tuple[str, ...] = registry.names(registry.TRAIN)
GENERATE_KNOBS: tuple[str, ...] = registry.names(registry.GENERATE)


def _knob_values(cfg: Any) -> dict[str, Any]:
    return {name: getattr(cfg, name) for name in cfg.KNOB_NAMES}


def _post_init(self: Any) -> None:
    """Each knob's type, choices and range, then its rules with the others (the registry's)."""
    for knob in registry.knobs_of(self.TASK):
        problem = knob.check(getattr(self, knob.name))
        if problem is not None:
            raise UsageError(problem)
    values = _knob_values(self)
    for knob in registry.knobs_of(self.TASK):
        if knob.requires is not None and (why := knob.requires(values)) is not None:
            raise UsageError(why)
    for knob in registry.knobs_of(self.TASK):
        if knob.kind is registry.Kind.BLOCKS:
            object.__setattr__(self, knob.name, tuple(sorted(getattr(self, knob.name))))


def _to_dict(self: Any) -> dict[str, Any]:
    """Plain JSON values (lists, not tuples), for recipes, user attrs and --json."""
    return {name: list(v) if isinstance(v, tuple) else v for name, v in _knob_values(self).items()}


def _from_dict(cls: type, data: Mapping[str, Any], *, where: str | None = None) -> Any:
    """Knobs from a mapping (a recipe, a stored trial, a space's values); `where` prefixes
    every error ("recipe r.json: config")."""
    prefix = f"{where}: " if where else ""
    if not isinstance(data, Mapping):
        raise UsageError(f"{prefix}expected a mapping of knobs, got {type(data).__name__}")
    unknown = sorted((str(k) for k in set(data) - set(cls.KNOB_NAMES)), key=str)
    if unknown:
        raise UsageError(f"{prefix}unknown knob {_short(unknown[0])}; valid knobs: {', '.join(cls.KNOB_NAMES)}")
    values = dict(data)
    for knob in registry.knobs_of(cls.TASK):
        if knob.kind is registry.Kind.BLOCKS and knob.name in values:
            layers = values[knob.name]
            if layers is not None and not isinstance(layers, (list, tuple)):
                raise UsageError(f"{prefix}{knob.name} must be a list of block indices, got {_short(layers)}")
            values[knob.name] = tuple(layers or ())
    try:
        return cls(**values)
    except UsageError as exc:
        raise UsageError(f"{prefix}{exc}") from None


def _replace(self: Any, **changes: Any) -> Any:
    return dataclasses.replace(self, **changes)


def _with_overrides(self: Any, assignments: Mapping[str, str]) -> Any:
    """Apply `knob=value` strings from the command line (`--set`). A knob the others make
    meaningless (prefetch without workers) goes back to its default unless it was set too,
    so `--set num_workers=0` works on its own; explicit conflicts still fail."""
    values = self.to_dict()
    for name, text in assignments.items():
        values[name] = parse_knob(name, text, task=self.TASK)
    for knob in registry.knobs_of(self.TASK):
        if knob.inactive is not None and knob.name not in assignments and knob.inactive(values):
            values[knob.name] = knob.default
    return type(self).from_dict(values)


def _annotation(knob: registry.Knob) -> str:
    return {
        registry.Kind.INTEGER: "int",
        registry.Kind.OPTIONAL_INTEGER: "int | None",
        registry.Kind.BOOLEAN: "bool",
        registry.Kind.CHOICE: "str",
        registry.Kind.BLOCKS: "tuple[int, ...]",
    }[knob.kind]


def _config_class(task: str, name: str, what: str) -> type:
    """A frozen dataclass of the knobs of `task`, made from the registry: its fields, defaults,
    validation (types, ranges, rules) and `--set` parsing."""
    knobs = registry.knobs_of(task)
    lines = "\n".join(
        f"    {k.name}: {k.values_help}; default {registry.value_text(k.default) or 'none'}" for k in knobs
    )
    namespace = {
        "__doc__": f"Every knob of {what}, from `autotune.registry` (each declared once there, with\n"
        "where it takes effect and a test that fails if it stops doing so). A frozen value,\n"
        "validated once when built from the CLI, a YAML space, a recipe or an Optuna trial.\n\n" + lines,
        "TASK": task,
        "KNOB_NAMES": registry.names(task),
        "__post_init__": _post_init,
        "to_dict": _to_dict,
        "from_dict": classmethod(_from_dict),
        "replace": _replace,
        "with_overrides": _with_overrides,
    }
    fields = [(k.name, _annotation(k), dataclasses.field(default=k.default)) for k in knobs]
    cls = dataclasses.make_dataclass(name, fields, namespace=namespace, frozen=True)
    cls.__module__ = __name__  # pickling and reprs find it here
    return cls


TrainConfig = _config_class(registry.TRAIN, "TrainConfig", "a training run")
# Text generation's knobs (`autotune bench --task generate`, `search --task generate`).
GenerateConfig = _config_class(registry.GENERATE, "GenerateConfig", "a text generation run")
CONFIG_CLASSES: dict[str, type] = {registry.TRAIN: TrainConfig, registry.GENERATE: GenerateConfig}


def config_class(task: str) -> type:
    """The configuration class of `task` ("train", "generate"); UsageError for another."""
    if task not in CONFIG_CLASSES:
        raise UsageError(f"unknown task {_short(task)}: expected one of {', '.join(CONFIG_CLASSES)}")
    return CONFIG_CLASSES[task]


def parse_knob(knob: str, text: str, *, task: str = registry.TRAIN) -> Any:
    """Parse one `--set knob=value` string into the knob's typed value (a knob of `task`)."""
    known = registry.names(task)
    if knob not in known:
        raise UsageError(f"unknown knob {_short(knob)}; valid knobs: {', '.join(known)}")
    declared = registry.knob(knob)
    try:
        return declared.parse(text)
    except ValueError:
        raise UsageError(f"invalid value {_short(text)} for {knob}: expected {declared.values_help}") from None


def knob_text(value: Any) -> str:
    """A knob value as `--set` and `parse_knob` spell it: true/false, 0,1,2, none."""
    return registry.value_text(value)


def parse_assignments(
    pairs: tuple[str, ...] | list[str], *, task: str = registry.TRAIN, option: str = "--set"
) -> dict[str, str]:
    """`["amp_dtype=bfloat16", ...]` -> `{"amp_dtype": "bfloat16"}`; malformed pairs fail, and so
    does a knob given two values (the last one would win, silently). `option`: the option the pairs
    come from, as the errors name it."""
    known = registry.names(task)
    out: dict[str, str] = {}
    parsed: dict[str, Any] = {}
    for pair in pairs:
        knob, sep, value = pair.partition("=")
        knob = knob.strip()
        if not sep or not knob:
            raise UsageError(f"{option} expects knob=value, got {_short(pair)}; knobs: {', '.join(known)}")
        if knob not in known:
            raise UsageError(f"unknown knob {_short(knob)} in {option}; valid knobs: {', '.join(known)}")
        read = parse_knob(knob, value, task=task)  # validate early so the error names the knob
        if parsed.setdefault(knob, read) != read:
            first, then = _short(out[knob].strip()), _short(value.strip())
            raise UsageError(f"{option}: {knob} is given twice, as {first} and {then}; give it once")
        out[knob] = value
    return out


def parse_fixed(text: str | None, *, task: str = registry.TRAIN) -> dict[str, Any]:
    """`--fix`: knobs of `task` held at a value, "amp_dtype=bfloat16,compile_mode=none" -> typed values.
    A part without "=" continues the value before it (a block list: checkpoint_layers=0,1)."""
    if not text:
        return {}
    parts: list[str] = []
    for part in (p for p in text.split(",") if p.strip()):
        if "=" not in part and parts:
            parts[-1] += "," + part
        else:
            parts.append(part)
    pairs = parse_assignments(parts, task=task, option="--fix")
    return {name: parse_knob(name, value, task=task) for name, value in pairs.items()}


@dataclass(frozen=True)
class RunSpec:
    """What one measurement runs: the model, the data and how long to measure.
    Everything here stays fixed across the trials of a study; the knobs vary."""

    model: str = "gpt2-tiny"
    device: str = "cpu"  # "cpu", "cuda" or "cuda:N"
    data: str = "synthetic"
    seq_len: int | None = None  # None: the model's context length
    warmup: int = 3
    steps: int = 20
    # Time at least this long as well: on a fast device 20 steps can last a fraction of a
    # second, too short a window for a figure that must reproduce within a few percent.
    min_time_s: float = 2.0
    seed: int = 0
    memory_limit_bytes: int | None = None  # enforced through the allocator on CUDA
    # A run is ok only if its worst-case peak is within the limit less this share of it (a
    # study's --memory-headroom; 0 outside a study): the one feasibility rule, decided in the run.
    memory_headroom: float = 0.0
    # Positions per optimizer step (padding included, as token_budget counts them), reached by
    # accumulating token_budget micro-batches (see `accumulation_steps`); None: one micro-batch
    # per optimizer step, the token budget itself.
    global_batch_tokens: int | None = None
    # A search's best less a margin: a run whose short first window is clearly below it (beyond
    # its 95 % interval) is not timed in full (measure.loop). None: every run is timed in full.
    prune_below_tokens_per_sec: float | None = None
    # Ranks on this host, one per device (torchrun's --nproc-per-node): a run of more than one is
    # one launch of that many ranks (`trial.ranks`); the global batch is across all of them.
    nproc_per_node: int = 1

    def __post_init__(self) -> None:
        kind = self.device.split(":", 1)[0]
        if kind not in DEVICE_KINDS:
            raise UsageError(f"unknown device {self.device!r}: expected cpu, cuda or cuda:N")
        check_int("warmup", self.warmup, minimum=0)
        check_int("steps", self.steps, minimum=2)
        if not is_finite_number(self.min_time_s) or self.min_time_s < 0:
            raise UsageError(f"min_time_s must be a number of seconds >= 0, got {self.min_time_s!r}")
        if self.min_time_s > MAX_MIN_TIME_S:
            raise UsageError(f"min_time_s must be at most {MAX_MIN_TIME_S:g} seconds, got {self.min_time_s!r}")
        check_int("steps", self.steps, minimum=2, maximum=MAX_STEPS)
        check_int("warmup", self.warmup, minimum=0, maximum=MAX_STEPS)
        check_int("seed", self.seed, minimum=0, maximum=MAX_SEED)
        if self.seq_len is not None:
            check_int("seq_len", self.seq_len, minimum=2)
        if self.global_batch_tokens is not None:
            check_int("global_batch_tokens", self.global_batch_tokens, minimum=1, maximum=MAX_GLOBAL_BATCH_TOKENS)
        check_int("nproc_per_node", self.nproc_per_node, minimum=1, maximum=MAX_NPROC_PER_NODE)
        if self.prune_below_tokens_per_sec is not None and not (
            is_finite_number(self.prune_below_tokens_per_sec) and self.prune_below_tokens_per_sec > 0
        ):
            raise UsageError(
                f"prune_below_tokens_per_sec must be a positive number, got {self.prune_below_tokens_per_sec!r}"
            )
        if not is_finite_number(self.memory_headroom) or not 0 <= self.memory_headroom < 1:
            raise UsageError(f"memory_headroom must be a fraction from 0 to below 1, got {self.memory_headroom!r}")

    def accumulation_steps(self, cfg: TrainConfig) -> int:
        """Micro-batches per optimizer step, on each rank, for `cfg` in this run (see `accumulation_for`)."""
        return accumulation_for(self.global_batch_tokens, cfg, world_size=self.nproc_per_node)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        if self.nproc_per_node == 1:  # a single-process run's request reads as it always has
            del data["nproc_per_node"]
        return data

    @property
    def device_kind(self) -> str:
        return self.device.split(":", 1)[0]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RunSpec":
        return cls(**dict(data))


MAX_NEW_TOKENS = 1 << 16  # --new-tokens: far beyond any context autotune's models have
MAX_PROMPTS = 100_000  # prompt lengths a workload holds (a prompts file's lines)
DEFAULT_AGREE_TOKENS = 8  # 16-bit generation must match the float32 reference on this many first tokens


def padded_width(longest: int, bucket: int) -> int:
    """The width prompts of at most `longest` tokens are left-padded to: a multiple of `bucket`
    (knob `prompt_bucket`)."""
    return -(-longest // bucket) * bucket


def check_workload(prompt_lens: Sequence[int], new_tokens: int, agree_tokens: int = DEFAULT_AGREE_TOKENS) -> None:
    """Refuse (UsageError) a generation workload out of bounds: the one rule for a search's options,
    `verify`'s run and the recipe loader (every command that reads a recipe), so no command takes
    a workload another one refuses. The model's context is checked where the model is known
    (`check_workload_fits`)."""
    if not prompt_lens or len(prompt_lens) > MAX_PROMPTS:
        raise UsageError(f"a workload needs from 1 to {MAX_PROMPTS} prompt lengths, got {len(prompt_lens)}")
    for n in prompt_lens:
        check_int("prompt length", n, minimum=1, maximum=MAX_SEQ_LEN)
    check_int("new_tokens", new_tokens, minimum=1, maximum=MAX_NEW_TOKENS)
    check_int("agree_tokens", agree_tokens, minimum=1, maximum=MAX_NEW_TOKENS)


def check_workload_fits(model: str, longest_prompt: int, new_tokens: int, context: int) -> None:
    """Refuse (UsageError) a generation workload longer than the model's context."""
    if longest_prompt + new_tokens > context:
        raise UsageError(
            f"prompts of up to {longest_prompt} tokens plus {new_tokens} new tokens do not fit the context of "
            f"{model}, {context} tokens"
        )


@dataclass(frozen=True)
class GenerateSpec:
    """What one generation measurement runs: the model, the workload and how long to measure.
    Fixed across the trials of a generation study; the knobs (`GenerateConfig`) vary.

    The workload is what the user will run: prompts of `prompt_lens` tokens (one length, or a
    prompts file's lengths, cycled into batches in a seeded order) and `new_tokens` greedy
    tokens for each, always that many (no early stop). A run is `warmup` generations beyond
    the warm-up over every prompt width, then at least `steps` timed generations and
    `min_time_s` seconds. `agree_tokens`: in 16-bit, the greedy tokens must match the eager
    float32 reference on at least this many first tokens (in float32: all of them)."""

    model: str = "gpt2-tiny"
    device: str = "cpu"
    prompt_lens: tuple[int, ...] = (32,)
    new_tokens: int = 32
    warmup: int = 1
    steps: int = 5
    min_time_s: float = 1.0
    seed: int = 0
    memory_limit_bytes: int | None = None
    memory_headroom: float = 0.0
    agree_tokens: int = DEFAULT_AGREE_TOKENS

    def __post_init__(self) -> None:
        if self.device.split(":", 1)[0] not in DEVICE_KINDS:
            raise UsageError(f"unknown device {self.device!r}: expected cpu, cuda or cuda:N")
        lens = tuple(self.prompt_lens)
        check_workload(lens, self.new_tokens, self.agree_tokens)
        object.__setattr__(self, "prompt_lens", lens)
        check_int("warmup", self.warmup, minimum=0, maximum=MAX_STEPS)
        check_int("steps", self.steps, minimum=2, maximum=MAX_STEPS)
        check_int("seed", self.seed, minimum=0, maximum=MAX_SEED)
        if not is_finite_number(self.min_time_s) or not 0 <= self.min_time_s <= MAX_MIN_TIME_S:
            raise UsageError(
                f"min_time_s must be a number of seconds from 0 to {MAX_MIN_TIME_S:g}, got {self.min_time_s!r}"
            )
        if not is_finite_number(self.memory_headroom) or not 0 <= self.memory_headroom < 1:
            raise UsageError(f"memory_headroom must be a fraction from 0 to below 1, got {self.memory_headroom!r}")

    @property
    def device_kind(self) -> str:
        return self.device.split(":", 1)[0]

    @property
    def longest_prompt(self) -> int:
        return max(self.prompt_lens)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["prompt_lens"] = list(self.prompt_lens)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "GenerateSpec":
        values = dict(data)
        values["prompt_lens"] = tuple(values.get("prompt_lens", (32,)))
        return cls(**values)


def accumulation_steps(global_batch_tokens: int | None, token_budget: int, world_size: int = 1) -> int:
    """Micro-batches of `token_budget` positions per optimizer step on each of `world_size`
    ranks, for a global batch of `global_batch_tokens` positions across all of them (None: 1, no
    accumulation). The rule is exact: the token budget times the ranks must divide the global
    batch, so every trial's optimizer step covers the same N positions (a rounded count would
    train some trials at another global batch than asked). A budget that does not divide it is
    UnsupportedConfig (a search prunes that trial)."""
    if global_batch_tokens is None:
        return 1
    per_step = token_budget * world_size
    ranks = f" on each of {world_size} ranks" if world_size > 1 else ""
    if per_step > global_batch_tokens:
        raise UnsupportedConfig(
            "token_budget",
            f"{token_budget} tokens a micro-batch{ranks} is more than the global batch of {global_batch_tokens} tokens",
        )
    if global_batch_tokens % per_step:
        raise UnsupportedConfig(
            "token_budget",
            f"{token_budget}{ranks} does not divide the global batch of {global_batch_tokens} tokens "
            "(accumulation needs a whole number of micro-batches)",
        )
    return global_batch_tokens // per_step


def accumulation_for(global_batch_tokens: int | None, cfg: TrainConfig, *, world_size: int = 1) -> int:
    """`accumulation_steps` for `cfg` on `world_size` ranks, which must also be able to
    accumulate that many micro-batches there: the knobs' run rules (the registry's `run_rule`:
    CUDA graphs cannot accumulate; ddp and fsdp2 need several ranks, and several ranks need one
    of them, and DataLoader workers that leave each rank a CPU of its own)."""
    steps = accumulation_steps(global_batch_tokens, cfg.token_budget, world_size)
    values = _knob_values(cfg)
    run = {"accumulation_steps": steps, "world_size": world_size, "cpus": usable_cpus()}
    for knob in registry.knobs_of(registry.TRAIN):
        if knob.run_rule is not None and (why := knob.run_rule(values, run)) is not None:
            raise UnsupportedConfig(knob.name, why)
    return steps


def check_int(name: str, value: Any, *, minimum: int, maximum: int | None = None) -> None:
    """Refuse anything but a true int in [minimum, maximum] (bool is an int in Python, not here)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise UsageError(f"{name} must be an integer >= {minimum}, got {_short(value)}")
    if maximum is not None and value > maximum:
        raise UsageError(f"{name} must be an integer <= {maximum}, got {_short(value)}")


def _short(value: Any) -> str:
    return registry._short(value)


def max_num_workers_here() -> int:
    """The most DataLoader workers a configuration may start on this machine."""
    value = environment.value(MAX_WORKERS_ENV)
    return value if value is not None else max(WORKERS_FLOOR, WORKERS_PER_CPU * usable_cpus())


def check_workers_here(num_workers: int, *, where: str) -> None:
    """Refuse more DataLoader workers than this machine should start (each is a process)."""
    cap = max_num_workers_here()
    if num_workers > cap:
        how = (
            f"{MAX_WORKERS_ENV} allows {cap}"
            if environment.is_set(MAX_WORKERS_ENV)
            else f"at most {WORKERS_PER_CPU} per CPU, {usable_cpus()} CPUs here"
        )
        raise UsageError(
            f"{where}: num_workers {num_workers} is more than {cap} ({how}); each worker is a process. "
            f"Set {MAX_WORKERS_ENV}=N to allow more"
        )


def check_runnable_here(cfg: TrainConfig, *, where: str = "config") -> None:
    """What a configuration asks of this machine, checked before anything starts."""
    check_workers_here(cfg.num_workers, where=where)


def normalize_config_dict(config: Mapping[str, Any]) -> dict[str, Any]:
    """A stored config dict made comparable across studies and autotune versions: through
    TrainConfig where it still reads (lists for tuples, defaults for missing knobs), else
    as it is with tuples turned into lists."""
    cls = GenerateConfig if set(config) and set(config) <= set(GENERATE_KNOBS) else TrainConfig
    try:
        return cls.from_dict(config).to_dict()
    except UsageError:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in config.items()}


# --- files a user hands us (search spaces, recipes) -------------------------------------------

# A space or a recipe is a few kilobytes; a megabyte is generous. The cap also keeps a file
# that never ends (/dev/zero, a pipe) from being read forever.
MAX_CONFIG_FILE_BYTES = 1 << 20
# Far deeper than any space or recipe nests; deeper input would exhaust Python's recursion.
MAX_YAML_DEPTH = 64
# No value a space or a recipe holds needs more than 64 bits; a longer integer is a typo or an
# attack (int() of 5000 digits raises Python's digit-limit ValueError; of a million, takes seconds).
MAX_FILE_INTEGER = 2**63 - 1
_MAX_INTEGER_CHARS = 40  # checked before int() is called


def read_config_file(path: str | Path, *, what: str) -> str:
    """The text of a small UTF-8 file, or one UsageError line: `what` names it ("recipe X")."""
    path = Path(path)
    try:
        # Checked before opening: open() of a FIFO blocks until a writer comes, maybe never.
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise UsageError(f"{what}: not a regular file")
        # O_NONBLOCK too, and checked again on what was opened: the path may change meanwhile.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        with open(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise UsageError(f"{what}: not a regular file")
            data = f.read(MAX_CONFIG_FILE_BYTES + 1)
    except UsageError:
        raise
    except OSError as exc:
        raise UsageError(f"{what}: cannot read it ({exc.strerror or type(exc).__name__})") from None
    except ValueError as exc:  # a path with a NUL byte
        raise UsageError(f"{what}: cannot read it ({exc})") from None
    if len(data) > MAX_CONFIG_FILE_BYTES:
        raise UsageError(f"{what}: larger than {MAX_CONFIG_FILE_BYTES // 1024} KiB; this is not a config file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{what}: not UTF-8 text (byte {exc.start} is {data[exc.start]:#04x})") from None


class _StrictLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` (no tags that build objects) that also refuses

    - anchors and aliases (&a / *a): a few lines of them expand to gigabytes once the data is
      walked (the "billion laughs"), and nothing autotune reads needs them;
    - duplicate keys, which YAML resolves silently by keeping the last one;
    - nesting deeper than MAX_YAML_DEPTH (which would exhaust Python's recursion);
    - tags that make other than plain values (!!binary, !!set, ...). Unquoted dates stay text."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise yaml.composer.ComposerError(
                None, None, "anchors and aliases (&name, *name) are not allowed", event.start_mark
            )
        self._depth = getattr(self, "_depth", 0) + 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise yaml.composer.ComposerError(
                    None, None, f"nested more than {MAX_YAML_DEPTH} levels deep", event.start_mark
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                if not isinstance(key, (str, int, float, bool)) and key is not None:
                    raise yaml.constructor.ConstructorError(
                        None, None, "a key must be plain text or a number", key_node.start_mark
                    )
                if key in seen:
                    raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: Any) -> int:
        text = str(node.value)
        if len(text) > _MAX_INTEGER_CHARS:
            raise yaml.constructor.ConstructorError(None, None, _huge_integer(text), node.start_mark)
        value = super().construct_yaml_int(node)
        if abs(value) > MAX_FILE_INTEGER:
            raise yaml.constructor.ConstructorError(None, None, _huge_integer(text), node.start_mark)
        return value

    def construct_plain_timestamp(self, node: Any) -> str:
        return self.construct_scalar(node)

    def construct_refused(self, node: Any) -> Any:
        raise yaml.constructor.ConstructorError(
            None, None, f"the tag {node.tag} is not allowed (plain values only)", node.start_mark
        )


_StrictLoader.add_constructor("tag:yaml.org,2002:timestamp", _StrictLoader.construct_plain_timestamp)
_StrictLoader.add_constructor("tag:yaml.org,2002:int", _StrictLoader.construct_yaml_int)
for _tag in ("binary", "set", "omap", "pairs"):
    _StrictLoader.add_constructor(f"tag:yaml.org,2002:{_tag}", _StrictLoader.construct_refused)


def load_yaml(text: str) -> Any:
    """Parse YAML (or JSON, a subset of it) to plain values: dict, list, str, int, float,
    bool, None. Raises yaml.YAMLError for anything else, with the line where it can."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:
        raise yaml.YAMLError("nested too deeply") from None


class JsonProblem(ValueError):
    """What is wrong in a JSON file, in one line (with its line where known)."""


def load_json(text: str) -> Any:
    """Parse strict JSON to plain values: duplicate keys, NaN and Infinity, numbers that overflow
    a float and integers beyond MAX_FILE_INTEGER are refused (JsonProblem), where `json.loads`
    keeps the last key, reads NaN and inf, and raises Python's digit-limit error."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                raise JsonProblem(f"duplicate key {key[:60]!r}")
            out[key] = value
        return out

    def integer(digits: str) -> int:
        if len(digits) > _MAX_INTEGER_CHARS or abs(int(digits)) > MAX_FILE_INTEGER:
            raise JsonProblem(_huge_integer(digits))
        return int(digits)

    def number(digits: str) -> float:
        value = float(digits)
        if not math.isfinite(value):
            raise JsonProblem(f"the number {digits[:40]} is too large for a float")
        return value

    def constant(name: str) -> Any:
        raise JsonProblem(f"{name} is not a JSON number (write null, or a number)")

    try:
        return json.loads(text, object_pairs_hook=pairs, parse_int=integer, parse_float=number, parse_constant=constant)
    except json.JSONDecodeError as exc:
        raise JsonProblem(f"{exc.msg} at line {exc.lineno}") from None
    except RecursionError:
        raise JsonProblem("nested too deeply") from None


def _huge_integer(text: str) -> str:
    digits = sum(c.isdigit() for c in text)
    return f"an integer of {digits} digits is too large (at most {MAX_FILE_INTEGER}, 2**63 - 1)"


def yaml_problem(exc: yaml.YAMLError) -> str:
    """What is wrong in a YAML file, in one line, with its line number where YAML says it."""
    problem = getattr(exc, "problem", None)
    mark = getattr(exc, "problem_mark", None)
    if not problem:
        problem = getattr(exc, "reason", None) or (str(exc).splitlines() or [type(exc).__name__])[0]
        mark = mark or getattr(exc, "position", None)
    where = f" at line {mark.line + 1}" if hasattr(mark, "line") else ""
    return " ".join(f"{problem}{where}".split())


def is_finite_number(value: Any) -> bool:
    """An int or float (not a bool) that is neither infinite nor NaN."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
