"""Reading a search space from YAML, validated whole before anything runs.

Format (see search_spaces/*.yaml):

    version: 1
    description: free text
    fixed:                      # knobs held at one value in every trial
      batching: padded
    dimensions:                 # knobs the sampler chooses
      num_workers: {choices: [0, 2, 4]}
      prefetch_factor: {choices: [2, 4], when: {num_workers: {gt: 0}}}   # conditional
      token_budget: {low: 4096, high: 65536, log: true, step: 1024}     # or choices
      checkpoint:               # the checkpointed set, as a count and a placement
        count: {low: 0, high: n_layer}
        placement: {choices: [first, last, spread]}
      # or counts relative to the depth, partial ones only for deep models:
      #   count: {choices: [0, n_layer/4, n_layer/2, 3*n_layer/4, n_layer], partial_when: {n_layer: {ge: 24}}}
    rules:                      # combinations rejected before any process starts
      - when: {sdpa_backend: flash}
        require: {amp_dtype: [float16, bfloat16]}
        reason: flash attention needs float16 or bfloat16

Conditions (`when`) map a knob to a value, a list of values, or {gt|ge|lt|le: number}.
Checkpoint counts may be written against the model's depth: `n_layer`, `n_layer/K` or
`M*n_layer/K` (rounded down when the space is bound to a model). `partial_when`, a condition
on `n_layer`, keeps the counts strictly between 0 and n_layer (partial checkpointing) only
for models that meet it; the placement is asked only for a partial count.
Every error names the file and the key at fault.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

import yaml

from autotune.config import KNOBS, knob_text, parse_knob
from autotune.errors import UsageError
from autotune.search.space import (
    COMPARISONS,
    PLACEMENTS,
    CheckpointDimension,
    Dimension,
    Rule,
    SearchSpace,
    matches,
)

_TOP_KEYS = {"version", "description", "fixed", "dimensions", "rules"}
_DIM_KEYS = {"choices", "low", "high", "log", "step", "when"}
_CATEGORICAL = (
    "amp_dtype",
    "compile_mode",
    "compile_scope",
    "sdpa_backend",
    "loss_impl",
    "attention_mask",
    "batching",
    "pin_memory",
    "persistent_workers",
    "expandable_segments",
)
# A checkpoint count relative to the depth: n_layer, n_layer/K, M*n_layer/K.
_DEPTH_COUNT = re.compile(r"^\s*(?:(\d+)\s*\*\s*)?n_layer\s*(?:/\s*(\d+)\s*)?$")


def default_space_path(device_kind: str) -> Path:
    """The shipped space for a device: search_spaces/gpt2.yaml on CUDA, cpu.yaml on CPU. They
    ship inside the package (autotune.search_spaces), so an installed wheel has them too."""
    name = "cpu.yaml" if device_kind == "cpu" else "gpt2.yaml"
    return Path(str(resources.files("autotune.search_spaces").joinpath(name)))


def load_space(path: str | Path, *, n_layer: int | None = None, seq_len: int | None = None) -> SearchSpace:
    """Read and validate a space file, bound to a model's depth and context when given."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"search space {path}: cannot read it ({exc.strerror})") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise UsageError(f"search space {path}: malformed YAML{where} ({getattr(exc, 'problem', exc)})") from None
    if not isinstance(raw, dict):
        raise UsageError(f"search space {path}: expected a mapping with 'dimensions', got {type(raw).__name__}")
    return parse_space(raw, source=str(path), n_layer=n_layer, seq_len=seq_len)


def parse_space(
    raw: Mapping[str, Any], *, source: str, n_layer: int | None = None, seq_len: int | None = None
) -> SearchSpace:
    return _Parser(source, n_layer).space(raw, seq_len)


class _Parser:
    """Validation of one file; every error is `search space FILE: KEY: what is wrong`."""

    def __init__(self, source: str, n_layer: int | None) -> None:
        self.source = source
        self.n_layer = n_layer

    def error(self, key: str, message: str) -> UsageError:
        return UsageError(f"search space {self.source}: {key}: {message}")

    def space(self, raw: Mapping[str, Any], seq_len: int | None) -> SearchSpace:
        unknown = sorted(set(raw) - _TOP_KEYS)
        if unknown:
            raise self.error(unknown[0], f"unknown key; expected {', '.join(sorted(_TOP_KEYS))}")
        if raw.get("version", 1) != 1:
            raise self.error("version", f"unsupported version {raw.get('version')!r}; this autotune reads version 1")
        fixed = dict(raw.get("fixed") or {})
        for knob, value in fixed.items():
            self.check_knob(f"fixed.{knob}", knob)
            self.check_value(f"fixed.{knob}", knob, value)
        dims = raw.get("dimensions") or {}
        if not isinstance(dims, dict) or not dims:
            raise self.error("dimensions", "expected a non-empty mapping of knob -> {choices: [...]} or {low, high}")
        dimensions: dict[str, Dimension] = {}
        checkpoint = None
        for name, spec in dims.items():
            if name == "checkpoint":
                checkpoint = self.checkpoint(spec)
                continue
            self.check_knob(f"dimensions.{name}", name)
            if name in fixed:
                raise self.error(f"dimensions.{name}", "is also in fixed; keep it in one place")
            if (
                name in _CATEGORICAL
                and isinstance(spec, dict)
                and "choices" not in spec
                and {"low", "high"} <= set(spec)
            ):
                raise self.error(f"dimensions.{name}", "is categorical: give choices, not low/high")
            dimensions[name] = self.dimension(f"dimensions.{name}", name, spec)
        rules = tuple(self.rule(f"rules[{i}]", rule) for i, rule in enumerate(raw.get("rules") or []))
        space = SearchSpace(
            source=self.source,
            raw=raw,
            fixed=fixed,
            dimensions=dimensions,
            checkpoint=checkpoint,
            rules=rules,
            n_layer=self.n_layer,
            seq_len=seq_len,
        )
        self.check_against_model(space)
        return space

    def check_knob(self, key: str, knob: str) -> None:
        if knob not in KNOBS or knob == "checkpoint_layers":
            valid = [k for k in KNOBS if k != "checkpoint_layers"] + ["checkpoint"]
            raise self.error(key, f"unknown knob; valid: {', '.join(valid)}")

    def check_value(self, key: str, knob: str, value: Any) -> None:
        try:
            parse_knob(knob, knob_text(value))
        except UsageError as exc:
            raise self.error(key, str(exc)) from None

    def dimension(self, key: str, knob: str, spec: Any) -> Dimension:
        if not isinstance(spec, dict):
            raise self.error(key, "expected a mapping with choices, or low and high")
        unknown = sorted(set(spec) - _DIM_KEYS)
        if unknown:
            raise self.error(f"{key}.{unknown[0]}", f"unknown key; expected {', '.join(sorted(_DIM_KEYS))}")
        when = self.condition(f"{key}.when", spec.get("when"))
        if "choices" in spec:
            choices = spec["choices"]
            if not isinstance(choices, list) or not choices:
                raise self.error(f"{key}.choices", "expected a non-empty list")
            for value in choices:
                self.check_value(f"{key}.choices", knob, value)
            return Dimension(knob, choices=tuple(choices), when=when)
        if "low" in spec and "high" in spec:
            return self.integer_range(key, knob, spec, when)
        raise self.error(key, "expected choices, or low and high")

    def integer_range(self, key: str, name: str, spec: Mapping[str, Any], when: Mapping[str, Any] | None) -> Dimension:
        low, high, step = spec["low"], spec["high"], spec.get("step", 1)
        if not isinstance(low, int) or not (isinstance(high, int) or high == "n_layer") or not isinstance(step, int):
            raise self.error(key, "low, high and step must be integers (high may be n_layer)")
        if high == "n_layer" and self.n_layer is not None:
            high = self.n_layer
        if isinstance(high, int) and high < low:
            raise self.error(key, f"high {high} is below low {low}")
        return Dimension(name, low=low, high=high, log=bool(spec.get("log", False)), step=step, when=when)

    def checkpoint(self, spec: Any) -> CheckpointDimension:
        key = "dimensions.checkpoint"
        if not isinstance(spec, dict) or set(spec) - {"count", "placement", "when"} or "count" not in spec:
            raise self.error(
                key, "expected {count: {low, high} or {choices}, placement: {choices: [first, last, spread]}}"
            )
        count = spec["count"]
        if not isinstance(count, dict) or set(count) - _DIM_KEYS - {"partial_when"}:
            raise self.error(f"{key}.count", "expected {low, high} or {choices: [...]} of block counts")
        if "choices" in count:
            choices = count["choices"]
            if not isinstance(choices, list) or not choices:
                raise self.error(f"{key}.count.choices", "expected a non-empty list of block counts >= 0")
            counts = [self.block_count(f"{key}.count.choices", c) for c in choices]
            if "partial_when" in count:
                counts = self.partial_counts(f"{key}.count.partial_when", count["partial_when"], counts)
            count_dim = Dimension("checkpoint_count", choices=tuple(dict.fromkeys(counts)))
        elif "partial_when" in count:
            raise self.error(f"{key}.count.partial_when", "goes with count choices, not low and high")
        elif "low" in count and "high" in count:
            count_dim = self.integer_range(f"{key}.count", "checkpoint_count", count, None)
            if count_dim.low < 0:
                raise self.error(f"{key}.count", f"low {count_dim.low} is below 0")
        else:
            raise self.error(f"{key}.count", "expected choices, or low and high")
        placement = spec.get("placement", {"choices": ["spread"]})
        if (
            not isinstance(placement, dict)
            or set(placement) != {"choices"}
            or not isinstance(placement["choices"], list)
            or not placement["choices"]
            or not set(placement["choices"]) <= set(PLACEMENTS)
        ):
            raise self.error(
                f"{key}.placement", f"expected {{choices: [...]}} with values from {', '.join(PLACEMENTS)}"
            )
        return CheckpointDimension(count_dim, tuple(placement["choices"]))

    def block_count(self, key: str, value: Any) -> int | str:
        """A count of blocks: an integer >= 0, or one relative to the depth (resolved when
        the space is bound to a model, kept as written otherwise)."""
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        match = _DEPTH_COUNT.match(value) if isinstance(value, str) else None
        if match is None:
            raise self.error(
                key, f"{value!r} is not a block count: expected an integer >= 0, n_layer, n_layer/K or M*n_layer/K"
            )
        times, parts = int(match[1] or 1), int(match[2] or 1)
        if times == 0 or parts == 0 or times > parts:
            raise self.error(key, f"{value!r}: the fraction of n_layer must be above 0 and at most 1")
        return value if self.n_layer is None else times * self.n_layer // parts

    def partial_counts(self, key: str, cond: Any, counts: list[int | str]) -> list[int | str]:
        """`counts` without the partial ones (strictly between 0 and n_layer) when the
        model's depth does not meet `cond`, a condition on n_layer."""
        if not isinstance(cond, dict) or set(cond) != {"n_layer"}:
            raise self.error(key, "expected a condition on n_layer, e.g. {n_layer: {ge: 24}}")
        test = cond["n_layer"]
        if isinstance(test, dict):
            if not test or set(test) - set(COMPARISONS) or not all(isinstance(v, int) for v in test.values()):
                raise self.error(f"{key}.n_layer", f"expected operators from {', '.join(COMPARISONS)} with integers")
        elif not isinstance(test, (int, list)) or isinstance(test, bool):
            raise self.error(f"{key}.n_layer", "expected an integer, a list of them or {gt|ge|lt|le: n}")
        if self.n_layer is None or matches(cond, {"n_layer": self.n_layer}):
            return counts
        return [c for c in counts if c in (0, self.n_layer)]

    def condition(self, key: str, cond: Any) -> Mapping[str, Any] | None:
        if cond is None:
            return None
        if not isinstance(cond, dict):
            raise self.error(key, "expected a mapping of knob -> value, [values] or {gt|ge|lt|le: n}")
        for knob, test in cond.items():
            self.check_knob(f"{key}.{knob}", knob)
            if isinstance(test, dict) and (set(test) - set(COMPARISONS) or not test):
                raise self.error(f"{key}.{knob}", f"expected operators from {', '.join(COMPARISONS)}")
        return cond

    def rule(self, key: str, rule: Any) -> Rule:
        if (
            not isinstance(rule, dict)
            or set(rule) - {"when", "require", "reason"}
            or not {"when", "require"} <= set(rule)
        ):
            raise self.error(key, "expected {when: {...}, require: {...}, reason: text}")
        when = self.condition(f"{key}.when", rule["when"])
        require = self.condition(f"{key}.require", rule["require"])
        return Rule(when, require, str(rule.get("reason") or f"violates {key}"))

    def check_against_model(self, space: SearchSpace) -> None:
        """Values the model makes impossible are errors in the file, found before any trial."""
        budgets = space.dimensions.get("token_budget")
        if space.seq_len and budgets is not None:
            smallest = min(budgets.choices) if budgets.choices else budgets.low
            if smallest < space.seq_len:
                raise self.error(
                    "dimensions.token_budget",
                    f"{smallest} is smaller than the context length "
                    f"{space.seq_len}: one full-length sequence must fit in a step",
                )
        if space.checkpoint and self.n_layer is not None:
            count = space.checkpoint.count
            top = max(count.choices) if count.choices else count.high
            if isinstance(top, int) and top > self.n_layer:
                raise self.error(
                    "dimensions.checkpoint.count", f"{top} blocks, but the model has {self.n_layer}; use high: n_layer"
                )
