"""The space a generation study searches, and its two reference trials. Torch-free.

The space is made, not read from a file: each generation knob of the registry with the values
this device can run (a value every configuration with it would be refused for is left out:
CUDA graphs on a CPU, efficient attention on a CPU), the batch sizes `--batch` gives, the prompt
buckets that fit the model's context, and the knobs `--fix` holds. A transformers model cannot
compile its prefill nor run two attention kernels in one `generate` (the registry's model rules):
for it compile_prefill is held false and the prefill kernel follows the decode kernel.

The planner that searches it is `search.generation_planner`, which lists it whole
(`configurations`)."""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

from autotune import registry
from autotune.config import GenerateConfig, padded_width
from autotune.errors import UnsupportedConfig, UsageError
from autotune.knobs.support import DeviceCapabilities, check_model_supported, check_supported
from autotune.study.references import BASELINE, CHECKLIST

BUCKETS = (1, 16, 64)  # prompt padding buckets tried (those that fit the context)
DEFAULT_BATCHES = {"cpu": "1,2,4", "cuda": "1-64"}


class TransformersModel:
    """What the registry's model rules read of a transformers model (it generates through
    `generate`, keeps no cache of its own), without building one in the tuner."""

    def generate(self, *args: Any, **kwargs: Any) -> None: ...

    def _valid_auto_compile_criteria(self, *args: Any, **kwargs: Any) -> bool:
        return True

    def _supports_default_dynamic_cache(self) -> bool:
        return True


@dataclass(frozen=True)
class GenerationSpace:
    """Each searched knob's choices, the knobs held fixed, and whether the model is a transformers one."""

    choices: dict[str, tuple[Any, ...]]
    fixed: dict[str, Any] = field(default_factory=dict)
    transformers: bool = False

    def suggest(self, trial: Any) -> GenerateConfig:
        """A configuration from an Optuna trial: one categorical parameter per searched knob."""
        values = dict(self.fixed)
        for name, options in self.choices.items():
            values[name] = trial.suggest_categorical(name, list(options))
        return self.complete(values)

    def complete(self, values: Mapping[str, Any]) -> GenerateConfig:
        """The knobs a model or another knob decides (a transformers model's prefill kernel is its
        decode kernel; compile_prefill without a compiled decode goes back to false)."""
        values = dict(values)
        if self.transformers:
            values["prefill_sdpa"] = values.get("decode_sdpa", "auto")
            values["compile_prefill"] = False
        if values.get("decode_compile", "none") == "none":
            values["compile_prefill"] = False
        if values.get("decode_compile") == "reduce-overhead" and "kv_cache" not in self.fixed:
            values["kv_cache"] = "static"  # CUDA graphs of a dynamic cache are refused (registry)
        return GenerateConfig.from_dict(values)

    def configurations(self, caps: DeviceCapabilities) -> Iterator[tuple[dict[str, Any], GenerateConfig]]:
        """Every configuration of the space this device can run, with the Optuna params that make it
        (`suggest`'s): what the planner scores. Two param sets that complete to one configuration
        both come (the planner keeps the first)."""
        names = list(self.choices)
        for combination in itertools.product(*(self.choices[name] for name in names)):
            params = dict(zip(names, combination))
            try:
                cfg = self.complete({**self.fixed, **params})
            except UsageError:  # a rule between the knobs themselves
                continue
            if self.violation(cfg, caps) is None:
                yield params, cfg

    def violation(self, cfg: GenerateConfig, caps: DeviceCapabilities) -> str | None:
        """Why `cfg` cannot run here (the device's rules, a transformers model's), else None."""
        try:
            check_supported(cfg, caps)
            if self.transformers:
                check_model_supported(TransformersModel(), cfg)
        except UnsupportedConfig as exc:
            return str(exc)
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "choices": {k: list(v) for k, v in self.choices.items()},
            "fixed": dict(self.fixed),
            "transformers": self.transformers,
        }

    @property
    def hash(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


def parse_batches(text: str | None, device_kind: str) -> tuple[int, ...]:
    """`--batch`: "1-8" (the powers of two from 1 to 8, and both ends), "1,2,4" or "4"."""
    text = (text or DEFAULT_BATCHES["cuda" if device_kind == "cuda" else "cpu"]).strip()
    knob = registry.knob("batch_size")
    try:
        if "-" in text:
            low, high = (knob.parse(part) for part in text.split("-", 1))
            if low > high:
                raise ValueError(text)
            powers = {2**i for i in range(high.bit_length()) if low <= 2**i <= high}
            return tuple(sorted(powers | {low, high}))
        return tuple(sorted({knob.parse(part) for part in text.split(",")}))
    except ValueError:
        raise UsageError(
            f"--batch: cannot read {text[:40]!r}; expected a range like 1-8, a list like 1,2,4 or one size, each "
            f"from 1 to {registry.MAX_BATCH_SIZE}"
        ) from None


def generation_space(
    caps: DeviceCapabilities,
    *,
    batches: tuple[int, ...],
    longest_prompt: int,
    new_tokens: int,
    context: int,
    transformers: bool,
    fixed: Mapping[str, Any] | None = None,
) -> GenerationSpace:
    """The space of this device, model and workload (see the module docstring)."""
    fixed = dict(fixed or {})
    buckets = tuple(b for b in BUCKETS if padded_width(longest_prompt, b) + new_tokens <= context) or (1,)
    choices: dict[str, tuple[Any, ...]] = {"batch_size": batches, "prompt_bucket": buckets}
    categorical = [k for k in registry.knobs_of(registry.GENERATE) if k.categorical]
    runnable = _runnable_values(caps, [k.name for k in categorical], transformers)
    for knob in categorical:
        choices[knob.name] = tuple(v for v in _options(knob) if v in runnable[knob.name]) or (knob.default,)
    if transformers:
        for name in ("prefill_sdpa", "compile_prefill"):
            choices.pop(name)
    for name in fixed:
        choices.pop(name, None)
    searched = {k: v for k, v in choices.items() if len(v) > 1}
    single = {k: v[0] for k, v in choices.items() if len(v) == 1}
    return GenerationSpace(searched, {**single, **fixed}, transformers)


def _options(knob: registry.Knob) -> tuple[Any, ...]:
    return knob.choices if knob.kind is registry.Kind.CHOICE else (False, True)


def _runnable_values(caps: DeviceCapabilities, names: list[str], transformers: bool) -> dict[str, set[Any]]:
    """For each categorical knob, the values some configuration with it can run here."""
    options = [_options(registry.knob(n)) for n in names]
    space = GenerationSpace({}, {}, transformers)
    found: dict[str, set[Any]] = {n: set() for n in names}
    for combination in itertools.product(*options):
        values = dict(zip(names, combination))
        try:
            cfg = GenerateConfig(**values)
        except UsageError:  # a rule between the knobs themselves
            continue
        if space.violation(cfg, caps) is None:
            for name, value in values.items():
                found[name].add(value)
    return found


# --- the reference trials -------------------------------------------------------------------------


def baseline_config() -> GenerateConfig:
    """The untuned baseline: eager, a dynamic cache, float32, one prompt at a time."""
    return GenerateConfig()


def cure_config(caps: DeviceCapabilities, *, transformers: bool) -> tuple[GenerateConfig, list[str]]:
    """The seed article's cure: bf16 (fp16 where bf16 cannot run, float32 on a CPU without bf16
    instructions), SDPA, a static cache and a compiled decode step (CUDA graphs on CUDA), one
    prompt at a time. A knob the device or the model cannot run goes back to its default; the
    notes say which."""
    mode = "reduce-overhead" if caps.kind == "cuda" else "default"
    cfg = GenerateConfig(kv_cache="static", decode_compile=mode, dtype="bfloat16")
    notes: list[str] = []
    space = GenerationSpace({}, {}, transformers)
    for _ in range(len(cfg.to_dict())):
        why = space.violation(cfg, caps)
        if why is None:
            break
        knob = why.partition(":")[0]
        if knob == "dtype" and cfg.dtype == "bfloat16":
            cfg = cfg.replace(dtype="float16")
        else:
            cfg = cfg.replace(**{knob: registry.knob(knob).default})
        notes.append(f"{knob} changed ({why.partition(': ')[2]})")
    if cfg.dtype == "bfloat16" and not caps.cpu_bf16:
        cfg = cfg.replace(dtype="float32")
        notes.append("dtype changed (this CPU has no bf16 instructions; emulated bf16 is slower than float32)")
    return cfg, notes


def reference_config(name: str, caps: DeviceCapabilities, *, transformers: bool) -> tuple[GenerateConfig, list[str]]:
    if name == BASELINE:
        return baseline_config(), []
    if name == CHECKLIST:
        return cure_config(caps, transformers=transformers)
    raise UsageError(f"unknown reference trial {name!r}")
