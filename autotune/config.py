"""Typed, validated configurations: the knobs of one training run (`TrainConfig`) and
what is run (`RunSpec`). Both are frozen values, validated once when built from the CLI,
a YAML space, a recipe or an Optuna trial; every other module can trust them.

Also here, because spaces and recipes are both read through it: the one YAML reader for
files a user hands us (`read_config_file`, `load_yaml`), stricter than `yaml.safe_load`."""

from __future__ import annotations

import dataclasses
import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import yaml

from autotune.errors import UnsupportedConfig, UsageError

IGNORE_INDEX = -100  # the label of a pad position in every batch autotune makes: cross-entropy skips it

AMP_DTYPES = ("float32", "tf32", "float16", "bfloat16")
COMPILE_MODES = ("none", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# What torch.compile covers (see autotune/knobs/compile.py): each block; each block plus the
# head (final norm, lm_head and the loss) as one region; or the whole model in one graph.
COMPILE_SCOPES = ("blocks", "blocks+head", "model")
# How the head computes the loss (autotune/model/loss.py): standard = logits then cross-entropy;
# chunked = head and cross-entropy over chunks of tokens, the full logits never held at once.
LOSS_IMPLS = ("standard", "chunked")
# causal: plain causal attention; document: packed windows whose attention stops at document
# boundaries (FlexAttention's document mask, autotune/model/attention.py).
ATTENTION_MASKS = ("causal", "document")
SDPA_BACKENDS = ("auto", "math", "efficient", "flash", "cudnn")
# The torch.nn.attention.SDPBackend member each forced backend names (knobs and exports use it).
SDPA_KERNELS = {
    "math": "MATH",
    "efficient": "EFFICIENT_ATTENTION",
    "flash": "FLASH_ATTENTION",
    "cudnn": "CUDNN_ATTENTION",
}
# fixed: a fixed number of sequences per step, each padded to the context length (the
# untuned baseline); padded: length-grouped token-budget batches; packed: contiguous windows.
BATCHING_MODES = ("fixed", "padded", "packed")
DEVICE_KINDS = ("cpu", "cuda")

# Bounds on what any file or option may ask for, whatever the machine: beyond them a value is a
# typo or an attack (a recipe asking for 10,000 worker processes or a 10^12-token batch), never
# a configuration. What this machine can run is narrower: see `check_runnable_here`.
MAX_NUM_WORKERS = 1024
MAX_PREFETCH_FACTOR = 1024
MAX_TOKEN_BUDGET = 1 << 30  # a billion tokens in one step: far beyond any one device
MAX_BLOCK_INDEX = 100_000
# A global batch of at most this many micro-batches' worth: llama-scale runs use 4M tokens a
# step; 2^32 positions is far beyond any configuration, never a reason to loop forever.
MAX_GLOBAL_BATCH_TOKENS = 1 << 32
MAX_STEPS = 1_000_000  # --steps and --warmup
MAX_MIN_TIME_S = 3600.0  # --min-time: an hour of timed steps is already a benchmark, not a trial
# DataLoader workers are processes: more than a few per CPU only adds memory and scheduling.
# At most this many per usable CPU (and never fewer than WORKERS_FLOOR, so the shipped spaces
# and the checklist's 4 workers run on a small machine); AUTOTUNE_MAX_NUM_WORKERS overrides.
WORKERS_PER_CPU = 4
WORKERS_FLOOR = 8
MAX_WORKERS_ENV = "AUTOTUNE_MAX_NUM_WORKERS"


@dataclass(frozen=True)
class TrainConfig:
    """Every knob autotune tunes. Each one is applied in exactly one place (see `knobs.py`
    and `data.py`), and each has a test that fails if it stops taking effect."""

    num_workers: int = 0
    prefetch_factor: int | None = None  # only meaningful with workers (DataLoader rule)
    pin_memory: bool = False
    persistent_workers: bool = False
    # Positions per micro-batch, padding included: per optimizer step too, unless the run
    # fixes a global batch (RunSpec.global_batch_tokens), reached by gradient accumulation.
    token_budget: int = 8192
    batching: str = "padded"
    amp_dtype: str = "float32"
    compile_mode: str = "none"
    compile_scope: str = "blocks"  # only with compile_mode other than none
    sdpa_backend: str = "auto"
    loss_impl: str = "standard"
    attention_mask: str = "causal"  # document: only with batching packed
    checkpoint_layers: tuple[int, ...] = ()
    # The CUDA caching allocator's expandable_segments (PYTORCH_CUDA_ALLOC_CONF), set in the
    # trial process before CUDA starts: fewer fragments when batch shapes vary.
    expandable_segments: bool = False

    def __post_init__(self) -> None:
        check_int("num_workers", self.num_workers, minimum=0, maximum=MAX_NUM_WORKERS)
        check_int("token_budget", self.token_budget, minimum=1, maximum=MAX_TOKEN_BUDGET)
        if self.prefetch_factor is not None:
            check_int("prefetch_factor", self.prefetch_factor, minimum=1, maximum=MAX_PREFETCH_FACTOR)
            if self.num_workers == 0:
                raise UsageError("prefetch_factor needs num_workers > 0 (the main process does not prefetch)")
        if self.persistent_workers and self.num_workers == 0:
            raise UsageError("persistent_workers needs num_workers > 0")
        for name, value in (
            ("pin_memory", self.pin_memory),
            ("persistent_workers", self.persistent_workers),
            ("expandable_segments", self.expandable_segments),
        ):
            if not isinstance(value, bool):
                raise UsageError(f"{name} must be true or false, got {value!r}")
        _check_choice("batching", self.batching, BATCHING_MODES)
        _check_choice("amp_dtype", self.amp_dtype, AMP_DTYPES)
        _check_choice("compile_mode", self.compile_mode, COMPILE_MODES)
        _check_choice("compile_scope", self.compile_scope, COMPILE_SCOPES)
        _check_choice("sdpa_backend", self.sdpa_backend, SDPA_BACKENDS)
        if not isinstance(self.checkpoint_layers, (tuple, list)):
            raise UsageError(f"checkpoint_layers must be a list of block indices, got {self.checkpoint_layers!r}")
        _check_choice("loss_impl", self.loss_impl, LOSS_IMPLS)
        _check_choice("attention_mask", self.attention_mask, ATTENTION_MASKS)
        self._check_combinations()
        layers = tuple(self.checkpoint_layers)
        for index in layers:
            check_int("checkpoint_layers", index, minimum=0, maximum=MAX_BLOCK_INDEX)
        if len(set(layers)) != len(layers):
            raise UsageError(f"checkpoint_layers has repeated block indices: {list(layers)}")
        object.__setattr__(self, "checkpoint_layers", tuple(sorted(layers)))

    def _check_combinations(self) -> None:
        """Knobs that would not take effect with the others: a configuration claiming them
        would be measured as something it is not."""
        if self.compile_scope != "blocks" and self.compile_mode == "none":
            raise UsageError(
                f"compile_scope={self.compile_scope} needs a compile_mode other than none (nothing is compiled)"
            )
        if self.attention_mask == "document":
            if self.batching != "packed":
                # A padded or fixed row holds one document (or a piece of one) followed by
                # pads: causal attention already never crosses a document there.
                raise UsageError(
                    f"attention_mask=document needs batching=packed: a {self.batching} row holds one "
                    "document, so causal attention already stops at its boundary"
                )
            if self.sdpa_backend != "auto":
                raise UsageError(
                    "attention_mask=document runs FlexAttention, not scaled_dot_product_attention: "
                    f"sdpa_backend={self.sdpa_backend} would not take effect; leave it at auto"
                )

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values (lists, not tuples), for recipes, user attrs and --json."""
        data = dataclasses.asdict(self)
        data["checkpoint_layers"] = list(self.checkpoint_layers)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, where: str | None = None) -> "TrainConfig":
        """Knobs from a mapping (a recipe, a stored trial, a space's values); `where` prefixes
        every error ("recipe r.json: config")."""
        prefix = f"{where}: " if where else ""
        if not isinstance(data, Mapping):
            raise UsageError(f"{prefix}expected a mapping of knobs, got {type(data).__name__}")
        unknown = sorted((str(k) for k in set(data) - set(KNOBS)), key=str)
        if unknown:
            raise UsageError(f"{prefix}unknown knob {unknown[0]!r}; valid knobs: {', '.join(KNOBS)}")
        values = dict(data)
        if "checkpoint_layers" in values:
            layers = values["checkpoint_layers"]
            if layers is not None and not isinstance(layers, (list, tuple)):
                raise UsageError(f"{prefix}checkpoint_layers must be a list of block indices, got {_short(layers)}")
            values["checkpoint_layers"] = tuple(layers or ())
        try:
            return cls(**values)
        except UsageError as exc:
            raise UsageError(f"{prefix}{exc}") from None

    def replace(self, **changes: Any) -> "TrainConfig":
        return dataclasses.replace(self, **changes)

    def with_overrides(self, assignments: Mapping[str, str]) -> "TrainConfig":
        """Apply `knob=value` strings from the command line (`--set`)."""
        values = self.to_dict()
        for knob, text in assignments.items():
            values[knob] = parse_knob(knob, text)
        if values["num_workers"] == 0:
            # Defaults that only make sense with workers are dropped rather than rejected,
            # so `--set num_workers=0` works on its own; explicit conflicts still fail.
            if "prefetch_factor" not in assignments:
                values["prefetch_factor"] = None
            if "persistent_workers" not in assignments:
                values["persistent_workers"] = False
        return TrainConfig.from_dict(values)


KNOBS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(TrainConfig))

_KNOB_HELP = {
    "num_workers": f"an integer from 0 to {MAX_NUM_WORKERS}",
    "prefetch_factor": f"an integer from 1 to {MAX_PREFETCH_FACTOR}, or none",
    "pin_memory": "true or false",
    "persistent_workers": "true or false",
    "token_budget": f"an integer from 1 to {MAX_TOKEN_BUDGET} (tokens per step)",
    "batching": " | ".join(BATCHING_MODES),
    "amp_dtype": " | ".join(AMP_DTYPES),
    "compile_mode": " | ".join(COMPILE_MODES),
    "compile_scope": " | ".join(COMPILE_SCOPES),
    "sdpa_backend": " | ".join(SDPA_BACKENDS),
    "loss_impl": " | ".join(LOSS_IMPLS),
    "attention_mask": " | ".join(ATTENTION_MASKS),
    "checkpoint_layers": "comma-separated block indices, e.g. 0,1,2 (empty or none for no checkpointing)",
    "expandable_segments": "true or false",
}


def parse_knob(knob: str, text: str) -> Any:
    """Parse one `--set knob=value` string into the knob's typed value."""
    if knob not in KNOBS:
        raise UsageError(f"unknown knob {knob!r}; valid knobs: {', '.join(KNOBS)}")
    raw = text.strip()
    bad = UsageError(f"invalid value {text!r} for {knob}: expected {_KNOB_HELP[knob]}")
    if knob in ("num_workers", "token_budget", "prefetch_factor"):
        if knob == "prefetch_factor" and raw.lower() in ("none", ""):
            return None
        try:
            value = int(raw.replace("_", ""))
        except ValueError:
            raise bad from None
        top = {"num_workers": MAX_NUM_WORKERS, "token_budget": MAX_TOKEN_BUDGET}.get(knob, MAX_PREFETCH_FACTOR)
        if not (0 if knob == "num_workers" else 1) <= value <= top:
            raise bad
        return value
    if knob in ("pin_memory", "persistent_workers", "expandable_segments"):
        lowered = raw.lower()
        if lowered in ("true", "1", "yes", "on"):
            return True
        if lowered in ("false", "0", "no", "off"):
            return False
        raise bad
    if knob == "checkpoint_layers":
        if raw.lower() in ("", "none"):
            return ()
        try:
            layers = tuple(int(part) for part in raw.split(","))
        except ValueError:
            raise bad from None
        if any(not 0 <= layer <= MAX_BLOCK_INDEX for layer in layers):
            raise bad
        return layers
    choices = {
        "batching": BATCHING_MODES,
        "amp_dtype": AMP_DTYPES,
        "compile_mode": COMPILE_MODES,
        "compile_scope": COMPILE_SCOPES,
        "sdpa_backend": SDPA_BACKENDS,
        "loss_impl": LOSS_IMPLS,
        "attention_mask": ATTENTION_MASKS,
    }[knob]
    if raw not in choices:
        raise bad
    return raw


def knob_text(value: Any) -> str:
    """A knob value as `--set` and `parse_knob` spell it: true/false, 0,1,2, none."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return "none" if value is None else str(value)


def parse_assignments(pairs: tuple[str, ...] | list[str]) -> dict[str, str]:
    """`["amp_dtype=bfloat16", ...]` -> `{"amp_dtype": "bfloat16"}`; malformed pairs fail."""
    out: dict[str, str] = {}
    for pair in pairs:
        knob, sep, value = pair.partition("=")
        knob = knob.strip()
        if not sep or not knob:
            raise UsageError(f"--set expects knob=value, got {pair!r}; knobs: {', '.join(KNOBS)}")
        if knob not in KNOBS:
            raise UsageError(f"unknown knob {knob!r} in --set; valid knobs: {', '.join(KNOBS)}")
        parse_knob(knob, value)  # validate early so the error names the knob
        out[knob] = value
    return out


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
    # Positions per optimizer step (padding included, as token_budget counts them), reached by
    # accumulating token_budget micro-batches (see `accumulation_steps`); None: one micro-batch
    # per optimizer step, the token budget itself.
    global_batch_tokens: int | None = None

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
        if self.seq_len is not None:
            check_int("seq_len", self.seq_len, minimum=2)
        if self.global_batch_tokens is not None:
            check_int("global_batch_tokens", self.global_batch_tokens, minimum=1, maximum=MAX_GLOBAL_BATCH_TOKENS)

    def accumulation_steps(self, cfg: TrainConfig) -> int:
        """Micro-batches per optimizer step for `cfg` in this run (see `accumulation_steps`)."""
        return accumulation_steps(self.global_batch_tokens, cfg.token_budget)

    @property
    def device_kind(self) -> str:
        return self.device.split(":", 1)[0]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RunSpec":
        return cls(**dict(data))


def accumulation_steps(global_batch_tokens: int | None, token_budget: int) -> int:
    """Micro-batches of `token_budget` positions per optimizer step, for a global batch of
    `global_batch_tokens` positions (None: 1, no accumulation). The rule is exact: the token
    budget must divide the global batch, so every trial's optimizer step covers the same N
    positions (a rounded count would train some trials at another global batch than asked).
    A budget that does not divide it is UnsupportedConfig (a search prunes that trial)."""
    if global_batch_tokens is None:
        return 1
    if token_budget > global_batch_tokens:
        raise UnsupportedConfig(
            "token_budget",
            f"{token_budget} tokens a micro-batch is more than the global batch of {global_batch_tokens} tokens",
        )
    if global_batch_tokens % token_budget:
        raise UnsupportedConfig(
            "token_budget",
            f"{token_budget} does not divide the global batch of {global_batch_tokens} tokens "
            "(accumulation needs a whole number of micro-batches)",
        )
    return global_batch_tokens // token_budget


def check_int(name: str, value: Any, *, minimum: int, maximum: int | None = None) -> None:
    """Refuse anything but a true int in [minimum, maximum] (bool is an int in Python, not here)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise UsageError(f"{name} must be an integer >= {minimum}, got {_short(value)}")
    if maximum is not None and value > maximum:
        raise UsageError(f"{name} must be an integer <= {maximum}, got {_short(value)}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, as taskset or a container sets it)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def max_num_workers_here() -> int:
    """The most DataLoader workers a configuration may start on this machine."""
    raw = os.environ.get(MAX_WORKERS_ENV, "").strip()
    if raw:
        try:
            value = int(raw)
        except ValueError:
            value = -1
        if not 0 <= value <= MAX_NUM_WORKERS:
            raise UsageError(f"{MAX_WORKERS_ENV}: expected a whole number from 0 to {MAX_NUM_WORKERS}, got {raw!r}")
        return value
    return max(WORKERS_FLOOR, WORKERS_PER_CPU * usable_cpus())


def check_workers_here(num_workers: int, *, where: str) -> None:
    """Refuse more DataLoader workers than this machine should start (each is a process)."""
    cap = max_num_workers_here()
    if num_workers > cap:
        how = (
            f"{MAX_WORKERS_ENV} allows {cap}"
            if os.environ.get(MAX_WORKERS_ENV, "").strip()
            else f"at most {WORKERS_PER_CPU} per CPU, {usable_cpus()} CPUs here"
        )
        raise UsageError(
            f"{where}: num_workers {num_workers} is more than {cap} ({how}); each worker is a process. "
            f"Set {MAX_WORKERS_ENV}=N to allow more"
        )


def check_runnable_here(cfg: TrainConfig, *, where: str = "config") -> None:
    """What a configuration asks of this machine, checked before anything starts."""
    check_workers_here(cfg.num_workers, where=where)


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise UsageError(f"{name} must be one of {', '.join(choices)}; got {value!r}")


def normalize_config_dict(config: Mapping[str, Any]) -> dict[str, Any]:
    """A stored config dict made comparable across studies and autotune versions: through
    TrainConfig where it still reads (lists for tuples, defaults for missing knobs), else
    as it is with tuples turned into lists."""
    try:
        return TrainConfig.from_dict(config).to_dict()
    except UsageError:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in config.items()}


# --- files a user hands us (search spaces, recipes) -------------------------------------------

# A space or a recipe is a few kilobytes; a megabyte is generous. The cap also keeps a file
# that never ends (/dev/zero, a pipe) from being read forever.
MAX_CONFIG_FILE_BYTES = 1 << 20
# Far deeper than any space or recipe nests; deeper input would exhaust Python's recursion.
MAX_YAML_DEPTH = 64


def read_config_file(path: str | Path, *, what: str) -> str:
    """The text of a small UTF-8 file, or one UsageError line: `what` names it ("recipe X")."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
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

    def construct_plain_timestamp(self, node: Any) -> str:
        return self.construct_scalar(node)

    def construct_refused(self, node: Any) -> Any:
        raise yaml.constructor.ConstructorError(
            None, None, f"the tag {node.tag} is not allowed (plain values only)", node.start_mark
        )


_StrictLoader.add_constructor("tag:yaml.org,2002:timestamp", _StrictLoader.construct_plain_timestamp)
for _tag in ("binary", "set", "omap", "pairs"):
    _StrictLoader.add_constructor(f"tag:yaml.org,2002:{_tag}", _StrictLoader.construct_refused)


def load_yaml(text: str) -> Any:
    """Parse YAML (or JSON, a subset of it) to plain values: dict, list, str, int, float,
    bool, None. Raises yaml.YAMLError for anything else, with the line where it can."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:
        raise yaml.YAMLError("nested too deeply") from None


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
