"""Typed, validated configurations: the knobs of one training run (`TrainConfig`) and
what is run (`RunSpec`). Both are frozen values, validated once when built from the CLI,
a YAML space, a recipe or an Optuna trial; every other module can trust them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from autotune.errors import UsageError

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


@dataclass(frozen=True)
class TrainConfig:
    """Every knob autotune tunes. Each one is applied in exactly one place (see `knobs.py`
    and `data.py`), and each has a test that fails if it stops taking effect."""

    num_workers: int = 0
    prefetch_factor: int | None = None  # only meaningful with workers (DataLoader rule)
    pin_memory: bool = False
    persistent_workers: bool = False
    token_budget: int = 8192  # tokens per optimizer step, padding included
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
        check_int("num_workers", self.num_workers, minimum=0)
        check_int("token_budget", self.token_budget, minimum=1)
        if self.prefetch_factor is not None:
            check_int("prefetch_factor", self.prefetch_factor, minimum=1)
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
        _check_choice("loss_impl", self.loss_impl, LOSS_IMPLS)
        _check_choice("attention_mask", self.attention_mask, ATTENTION_MASKS)
        self._check_combinations()
        layers = tuple(self.checkpoint_layers)
        for index in layers:
            check_int("checkpoint_layers", index, minimum=0)
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
    def from_dict(cls, data: Mapping[str, Any], *, where: str = "config") -> "TrainConfig":
        unknown = sorted(set(data) - set(KNOBS))
        if unknown:
            raise UsageError(f"{where}: unknown knob {unknown[0]!r}; valid knobs: {', '.join(KNOBS)}")
        values = dict(data)
        if "checkpoint_layers" in values:
            values["checkpoint_layers"] = tuple(values["checkpoint_layers"] or ())
        return cls(**values)

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
    "num_workers": "an integer >= 0",
    "prefetch_factor": "an integer >= 1, or none",
    "pin_memory": "true or false",
    "persistent_workers": "true or false",
    "token_budget": "an integer >= 1 (tokens per step)",
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
        if value < (0 if knob == "num_workers" else 1):
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
        if any(layer < 0 for layer in layers):
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

    def __post_init__(self) -> None:
        kind = self.device.split(":", 1)[0]
        if kind not in DEVICE_KINDS:
            raise UsageError(f"unknown device {self.device!r}: expected cpu, cuda or cuda:N")
        check_int("warmup", self.warmup, minimum=0)
        check_int("steps", self.steps, minimum=2)
        if not isinstance(self.min_time_s, (int, float)) or self.min_time_s < 0:
            raise UsageError(f"min_time_s must be a number of seconds >= 0, got {self.min_time_s!r}")
        if self.seq_len is not None:
            check_int("seq_len", self.seq_len, minimum=2)

    @property
    def device_kind(self) -> str:
        return self.device.split(":", 1)[0]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RunSpec":
        return cls(**dict(data))


def check_int(name: str, value: Any, *, minimum: int) -> None:
    """Refuse anything but a true int >= minimum (bool is an int in Python, not here)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise UsageError(f"{name} must be an integer >= {minimum}, got {value!r}")


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
