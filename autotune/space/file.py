"""Reading a search space from YAML, validated whole before anything runs.

Format (see search_spaces/*.yaml):

    version: 1
    description: free text
    fixed:                      # knobs held at one value in every trial
      batching: padded
    dimensions:                 # knobs the sampler chooses
      num_workers: {choices: [0, 2, 4]}
      prefetch_factor: {choices: [2, 4], when: {num_workers: {gt: 0}}}   # conditional
      token_budget: {low: 4096, high: 65536, step: 4096}                # or choices, or log: true
      checkpoint:               # the checkpointed set, as a count and a placement
        count: {low: 0, high: n_layer}
        placement: {choices: [first, last, spread]}
      # or counts relative to the depth, partial ones only for deep models:
      #   count: {choices: [0, n_layer/4, n_layer/2, 3*n_layer/4, n_layer], partial_when: {n_layer: {ge: 24}}}
    rules:                      # combinations rejected before any process starts
      - when: {sdpa_backend: flash}
        require: {amp_dtype: [float16, bfloat16]}
        reason: flash attention needs float16 or bfloat16

Conditions (`when`) map a knob to a value, a list of values, or {gt|ge|lt|le: number}; a
dimension's `when` may only read knobs that are fixed or listed above it (they are sampled in
file order). Integer ranges: `step` >= 1 dividing high - low; `log: true` needs low >= 1 and
no step (Optuna samples a log range without one).

Everything is checked here, before any trial runs: a space that loads never fails mid-study.
Every error names the file and the key at fault. The YAML itself is read strictly (no anchors
or aliases, no duplicate keys, at most 1 MiB: see `config.load_yaml`).
Checkpoint counts may be written against the model's depth: `n_layer`, `n_layer/K` or
`M*n_layer/K` (rounded down when the space is bound to a model). `partial_when`, a condition
on `n_layer`, keeps the counts strictly between 0 and n_layer (partial checkpointing) only
for models that meet it; the placement is asked only for a partial count.
"""

from __future__ import annotations

import math
import re
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

import yaml

from autotune import registry
from autotune.config import (
    KNOBS,
    check_workers_here,
    knob_text,
    load_yaml,
    parse_knob,
    read_config_file,
    yaml_problem,
)
from autotune.errors import UsageError
from autotune.space.definition import (
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
# Knobs searched by choices only (names and truth values), from the registry.
_CATEGORICAL = tuple(k.name for k in registry.knobs_of(registry.TRAIN) if k.categorical)
# A checkpoint count relative to the depth: n_layer, n_layer/K, M*n_layer/K.
_DEPTH_COUNT = re.compile(r"^\s*(?:(\d+)\s*\*\s*)?n_layer\s*(?:/\s*(\d+)\s*)?$")
# The integer knobs, with the range each may take: what a low/high range and a comparison may name.
# The integer knobs, with the range each may take: what a low/high range and a comparison may
# name (from the registry), and the checkpoint dimension's block count.
_INTEGER_RANGES = {
    **{k.name: (k.low, k.high) for k in registry.knobs_of(registry.TRAIN) if k.integer},
    "checkpoint_count": (0, registry.MAX_BLOCK_INDEX),
}
MAX_CHOICES = 1000  # per dimension: a sampler cannot learn more


def default_space_path(device_kind: str, ranks: int = 1) -> Path:
    """The shipped space for a device: search_spaces/gpt2.yaml on CUDA, cpu.yaml on CPU; with
    several ranks, gpt2_ddp.yaml and cpu_ddp.yaml. They ship inside the package
    (autotune.search_spaces), so an installed wheel has them too."""
    name = "cpu.yaml" if device_kind == "cpu" else "gpt2.yaml"
    if ranks > 1:
        name = name.replace("gpt2", "gpt2_ddp").replace("cpu", "cpu_ddp")
    return Path(str(resources.files("autotune.search_spaces").joinpath(name)))


def load_space(path: str | Path, *, n_layer: int | None = None, seq_len: int | None = None) -> SearchSpace:
    """Read and validate a space file, bound to a model's depth and context when given."""
    path = Path(path)
    text = read_config_file(path, what=f"search space {path}")
    try:
        raw = load_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark and getattr(exc, "problem", None) else ""
        problem = getattr(exc, "problem", None) or yaml_problem(exc)
        raise UsageError(f"search space {path}: malformed YAML{where} ({' '.join(str(problem).split())})") from None
    if not isinstance(raw, dict):
        raise UsageError(f"search space {path}: expected a mapping with 'dimensions', got {type(raw).__name__}")
    return parse_space(raw, source=str(path), n_layer=n_layer, seq_len=seq_len)


def parse_space(
    raw: Mapping[str, Any], *, source: str, n_layer: int | None = None, seq_len: int | None = None
) -> SearchSpace:
    return _Parser(source, n_layer).space(raw, seq_len)


def with_fixed(space: SearchSpace, values: Mapping[str, Any]) -> SearchSpace:
    """`space` with `values` held (`--fix`): each knob taken out of the searched dimensions and
    fixed, validated as a space file's `fixed` is. `checkpoint_layers=none` drops the checkpoint
    dimension (no block checkpointed); other block lists cannot be held (a space searches counts)."""
    if not values:
        return space
    values = dict(values)
    raw = dict(space.raw)
    dims = dict(raw.get("dimensions") or {})
    if "checkpoint_layers" in values:
        if values.pop("checkpoint_layers"):
            raise UsageError(
                "--fix checkpoint_layers takes none only; to hold some blocks checkpointed give the space's checkpoint "
                "dimension one count (dimensions.checkpoint.count: {choices: [N]})"
            )
        dims.pop("checkpoint", None)
    searched = [name for name in dims if name not in values]
    if not searched:
        raise UsageError(f"--fix holds every knob {space.source} searches: nothing is left to search")
    raw["dimensions"] = {name: dims[name] for name in searched}
    raw["fixed"] = {**(raw.get("fixed") or {}), **values}
    return parse_space(raw, source=f"{space.source} with --fix", n_layer=space.n_layer, seq_len=space.seq_len)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class _Parser:
    """Validation of one file; every error is `search space FILE: KEY: what is wrong`."""

    def __init__(self, source: str, n_layer: int | None) -> None:
        self.source = source
        self.n_layer = n_layer

    def error(self, key: str, message: str) -> UsageError:
        # Keys are the file's own text: a newline or control character in one is shown
        # escaped, so that the error stays one line that says which key.
        shown = key if key.isprintable() else key.encode("unicode_escape").decode("ascii")
        return UsageError(f"search space {self.source}: {shown}: {message}")

    def space(self, raw: Mapping[str, Any], seq_len: int | None) -> SearchSpace:
        unknown = sorted(str(k) for k in set(raw) - _TOP_KEYS)
        if unknown:
            raise self.error(unknown[0], f"unknown key; expected {', '.join(sorted(_TOP_KEYS))}")
        version = raw.get("version", 1)
        if not _is_int(version) or version != 1:
            raise self.error("version", f"unsupported version {_shown(version)}; this autotune reads version 1")
        if not isinstance(raw.get("description", ""), str):
            raise self.error("description", "expected text")
        fixed = raw.get("fixed") or {}
        if not isinstance(fixed, dict):
            raise self.error("fixed", f"expected a mapping of knob -> value, got {type(fixed).__name__}")
        fixed = dict(fixed)
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
            # Sampled in file order: a condition can only read what is known by then.
            known = set(fixed) | set(dimensions)
            dimensions[name] = self.dimension(f"dimensions.{name}", name, spec, known)
        rules_raw = raw.get("rules") or []
        if not isinstance(rules_raw, list):
            raise self.error("rules", "expected a list of {when: {...}, require: {...}, reason: text}")
        rules = tuple(self.rule(f"rules[{i}]", rule) for i, rule in enumerate(rules_raw))
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
        self.check_against_machine(space)
        return space

    def check_knob(self, key: str, knob: Any) -> None:
        blocks = [k.name for k in registry.knobs_of(registry.TRAIN) if k.kind is registry.Kind.BLOCKS]
        if not isinstance(knob, str) or knob not in KNOBS or knob in blocks:
            valid = [k for k in KNOBS if k not in blocks] + ["checkpoint"]
            raise self.error(key, f"unknown knob; valid: {', '.join(valid)}")

    def check_value(self, key: str, knob: str, value: Any) -> None:
        """`value` must be exactly what the knob takes, type included: `pin_memory: 1` or
        `num_workers: "2"` would pass a text round trip, then fail once sampled."""
        if isinstance(value, (dict, list)):
            raise self.error(key, f"expected one value for {knob}, got a {type(value).__name__}")
        try:
            typed = parse_knob(knob, knob_text(value))
        except UsageError as exc:
            raise self.error(key, str(exc)) from None
        if typed != value or type(typed) is not type(value):
            raise self.error(key, f"invalid value {_shown(value)} for {knob}: expected {_expected(knob, typed)}")

    def dimension(self, key: str, knob: str, spec: Any, known: set[str]) -> Dimension:
        if not isinstance(spec, dict):
            raise self.error(key, "expected a mapping with choices, or low and high")
        unknown = sorted(str(k) for k in set(spec) - _DIM_KEYS)
        if unknown:
            raise self.error(f"{key}.{unknown[0]}", f"unknown key; expected {', '.join(sorted(_DIM_KEYS))}")
        when = self.condition(f"{key}.when", spec.get("when"))
        if when:
            for other in when:
                if other == knob:
                    raise self.error(f"{key}.when.{other}", "a dimension cannot depend on itself")
                if other not in known:
                    raise self.error(
                        f"{key}.when.{other}",
                        f"{other} is not fixed or sampled before {knob}; list it above {knob} (dimensions are "
                        "sampled in file order)",
                    )
        if "choices" in spec:
            if set(spec) & {"low", "high", "log", "step"}:
                raise self.error(key, "give choices, or low and high, not both")
            return Dimension(knob, choices=self.choices(f"{key}.choices", knob, spec["choices"]), when=when)
        if "low" in spec and "high" in spec:
            return self.integer_range(key, knob, spec, when)
        raise self.error(key, "expected choices, or low and high")

    def choices(self, key: str, knob: str, choices: Any) -> tuple[Any, ...]:
        if not isinstance(choices, list) or not choices:
            raise self.error(key, "expected a non-empty list")
        if len(choices) > MAX_CHOICES:
            raise self.error(key, f"{len(choices)} choices; at most {MAX_CHOICES}")
        for value in choices:
            self.check_value(key, knob, value)
        seen: list[Any] = []
        for value in choices:
            if value in seen:
                raise self.error(key, f"{knob_text(value)} is listed twice")
            seen.append(value)
        return tuple(choices)

    def integer_range(self, key: str, name: str, spec: Mapping[str, Any], when: Mapping[str, Any] | None) -> Dimension:
        if name not in _INTEGER_RANGES:
            raise self.error(key, "low/high ranges are for integer knobs (num_workers, prefetch_factor, token_budget)")
        low, high, step = spec["low"], spec["high"], spec.get("step", 1)
        if not _is_int(low) or not (_is_int(high) or high == "n_layer") or not _is_int(step):
            raise self.error(key, "low, high and step must be integers (high may be n_layer)")
        log = spec.get("log", False)
        if not isinstance(log, bool):
            raise self.error(f"{key}.log", f"expected true or false, got {_shown(log)}")
        least, most = _INTEGER_RANGES[name]
        if step < 1:
            raise self.error(f"{key}.step", f"must be at least 1, got {step}")
        if low < least:
            raise self.error(f"{key}.low", f"{name} must be at least {least}, got {low}")
        if high == "n_layer" and self.n_layer is not None:
            high = self.n_layer
        if isinstance(high, int):
            if high < low:
                raise self.error(key, f"high {high} is below low {low}")
            if high > most:
                raise self.error(f"{key}.high", f"{name} must be at most {most}, got {high}")
            if (high - low) % step:
                raise self.error(key, f"high - low ({high - low}) is not a multiple of step {step}")
        if log:
            if "step" in spec and step != 1:
                raise self.error(key, "log: true samples without a step; drop step, or drop log")
            if low < 1:
                raise self.error(f"{key}.low", f"log: true needs low >= 1, got {low}")
        return Dimension(name, low=low, high=high, log=log, step=step, when=when)

    def checkpoint(self, spec: Any) -> CheckpointDimension:
        key = "dimensions.checkpoint"
        if not isinstance(spec, dict) or set(spec) - {"count", "placement"} or "count" not in spec:
            raise self.error(
                key, "expected {count: {low, high} or {choices}, placement: {choices: [first, last, spread]}}"
            )
        count = spec["count"]
        if not isinstance(count, dict) or set(count) - _DIM_KEYS - {"partial_when"}:
            raise self.error(f"{key}.count", "expected {low, high} or {choices: [...]} of block counts")
        if "choices" in count:
            choices = count["choices"]
            if not isinstance(choices, list) or not choices or len(choices) > MAX_CHOICES:
                raise self.error(f"{key}.count.choices", "expected a non-empty list of block counts >= 0")
            if len(set(map(repr, choices))) != len(choices):
                raise self.error(f"{key}.count.choices", "expected distinct block counts")
            counts = [self.block_count(f"{key}.count.choices", c) for c in choices]
            if "partial_when" in count:
                counts = self.partial_counts(f"{key}.count.partial_when", count["partial_when"], counts)
            count_dim = Dimension("checkpoint_count", choices=tuple(dict.fromkeys(counts)))
        elif "partial_when" in count:
            raise self.error(f"{key}.count.partial_when", "goes with count choices, not low and high")
        elif "low" in count and "high" in count:
            count_dim = self.integer_range(f"{key}.count", "checkpoint_count", count, None)
        else:
            raise self.error(f"{key}.count", "expected choices, or low and high")
        placement = spec.get("placement", {"choices": ["spread"]})
        if (
            not isinstance(placement, dict)
            or set(placement) != {"choices"}
            or not isinstance(placement["choices"], list)
            or not placement["choices"]
            or not all(isinstance(p, str) and p in PLACEMENTS for p in placement["choices"])
            or len(set(placement["choices"])) != len(placement["choices"])
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
        """knob -> a value, a list of values, or {gt|ge|lt|le: number}; each value one the knob
        takes (a typo would make a condition that never holds), numbers only for integer knobs."""
        if cond is None:
            return None
        if not isinstance(cond, dict) or not cond:
            raise self.error(key, "expected a mapping of knob -> value, [values] or {gt|ge|lt|le: n}")
        for knob, test in cond.items():
            self.check_knob(f"{key}.{knob}", knob)
            if isinstance(test, dict):
                if not test or set(test) - set(COMPARISONS):
                    raise self.error(f"{key}.{knob}", f"expected operators from {', '.join(COMPARISONS)}")
                if knob not in _INTEGER_RANGES:
                    raise self.error(f"{key}.{knob}", f"{knob} is not a number: compare it with a value or a list")
                for op, bound in test.items():
                    if not _is_number(bound):
                        raise self.error(f"{key}.{knob}.{op}", f"expected a number, got {_shown(bound)}")
            elif isinstance(test, list):
                if not test:
                    raise self.error(f"{key}.{knob}", "expected a non-empty list of values")
                for value in test:
                    self.check_value(f"{key}.{knob}", knob, value)
            else:
                self.check_value(f"{key}.{knob}", knob, test)
        return cond

    def rule(self, key: str, rule: Any) -> Rule:
        if (
            not isinstance(rule, dict)
            or set(rule) - {"when", "require", "reason"}
            or not {"when", "require"} <= set(rule)
            or rule["when"] is None
            or rule["require"] is None
        ):
            raise self.error(key, "expected {when: {...}, require: {...}, reason: text}")
        when = self.condition(f"{key}.when", rule["when"])
        require = self.condition(f"{key}.require", rule["require"])
        reason = rule.get("reason")
        if reason is not None and not isinstance(reason, str):
            raise self.error(f"{key}.reason", "expected text")
        return Rule(when, require, reason or f"violates {key}")

    def check_against_model(self, space: SearchSpace) -> None:
        """Values the model makes impossible are errors in the file, found before any trial."""
        budgets = space.dimensions.get("token_budget")
        smallest = None
        if budgets is not None:
            smallest = min(budgets.choices) if budgets.choices else budgets.low
        elif "token_budget" in space.fixed:
            smallest = space.fixed["token_budget"]
        if space.seq_len and smallest is not None and smallest < space.seq_len:
            key = "dimensions.token_budget" if budgets is not None else "fixed.token_budget"
            raise self.error(
                key,
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

    def check_against_machine(self, space: SearchSpace) -> None:
        """DataLoader workers are processes: a space may not ask for more than this machine takes."""
        workers = space.dimensions.get("num_workers")
        if workers is not None:
            top = max(workers.choices) if workers.choices else workers.high
            key = "dimensions.num_workers"
        else:
            top, key = space.fixed.get("num_workers"), "fixed.num_workers"
        if isinstance(top, int):
            check_workers_here(top, where=f"search space {self.source}: {key}")


def _expected(knob: str, typed: Any) -> str:
    if isinstance(typed, bool):
        return "true or false"
    if knob in _INTEGER_RANGES:
        optional = registry.knob(knob).kind is registry.Kind.OPTIONAL_INTEGER
        return "an integer" + (" or none" if optional else "")
    return "one of its names, as text"
