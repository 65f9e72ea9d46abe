"""Search spaces: a YAML file declaring each dimension, validated once when loaded.

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
    rules:                      # combinations rejected before any process starts
      - when: {sdpa_backend: flash}
        require: {amp_dtype: [float16, bfloat16]}
        reason: flash attention needs float16 or bfloat16

Conditions (`when`) map a knob to a value, a list of values, or {gt|ge|lt|le: number}.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import yaml

from autotune.config import KNOBS, TrainConfig, parse_knob
from autotune.errors import UsageError

SPACE_DIR = Path(__file__).resolve().parent.parent / "search_spaces"
PLACEMENTS = ("first", "last", "spread")
_TOP_KEYS = {"version", "description", "fixed", "dimensions", "rules"}
_DIM_KEYS = {"choices", "low", "high", "log", "step", "when"}
_OPS = {"gt": lambda a, b: a > b, "ge": lambda a, b: a >= b, "lt": lambda a, b: a < b, "le": lambda a, b: a <= b}


def default_space_path(device_kind: str) -> Path:
    return SPACE_DIR / ("cpu.yaml" if device_kind == "cpu" else "gpt2.yaml")


@dataclass(frozen=True)
class Dimension:
    name: str
    choices: tuple[Any, ...] | None = None
    low: int | None = None
    high: int | str | None = None  # "n_layer" resolves to the model's block count
    log: bool = False
    step: int = 1
    when: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Rule:
    when: Mapping[str, Any]
    require: Mapping[str, Any]
    reason: str


class SearchSpace:
    """A validated space, bound to a model's block count and context length."""

    def __init__(self, source: str, raw: Mapping[str, Any], n_layer: int | None = None, seq_len: int | None = None):
        self.source = source
        self.raw = raw
        self.fixed: dict[str, Any] = dict(raw.get("fixed") or {})
        self.dimensions: dict[str, Dimension] = {}
        self.checkpoint: dict[str, Dimension] | None = None
        self.rules: list[Rule] = []
        self.n_layer = n_layer
        self.seq_len = seq_len
        self._parse()

    # --- loading ----------------------------------------------------------------------------

    @classmethod
    def load(cls, path: str | Path, *, n_layer: int | None = None, seq_len: int | None = None) -> "SearchSpace":
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
        return cls(str(path), raw, n_layer=n_layer, seq_len=seq_len)

    def _error(self, key: str, message: str) -> UsageError:
        return UsageError(f"search space {self.source}: {key}: {message}")

    def _parse(self) -> None:
        unknown = sorted(set(self.raw) - _TOP_KEYS)
        if unknown:
            raise self._error(unknown[0], f"unknown key; expected {', '.join(sorted(_TOP_KEYS))}")
        if self.raw.get("version", 1) != 1:
            raise self._error("version", f"unsupported version {self.raw.get('version')!r}; this autotune reads version 1")
        for knob, value in self.fixed.items():
            self._check_knob(f"fixed.{knob}", knob)
            self._check_value(f"fixed.{knob}", knob, value)
        dims = self.raw.get("dimensions") or {}
        if not isinstance(dims, dict) or not dims:
            raise self._error("dimensions", "expected a non-empty mapping of knob -> {choices: [...]} or {low, high}")
        for name, spec in dims.items():
            if name == "checkpoint":
                self.checkpoint = self._parse_checkpoint(spec)
            else:
                self._check_knob(f"dimensions.{name}", name)
                if name in self.fixed:
                    raise self._error(f"dimensions.{name}", "is also in fixed; keep it in one place")
                self.dimensions[name] = self._parse_dimension(f"dimensions.{name}", name, spec)
        for i, rule in enumerate(self.raw.get("rules") or []):
            self.rules.append(self._parse_rule(f"rules[{i}]", rule))
        self._check_against_model()

    def _check_knob(self, key: str, knob: str) -> None:
        if knob not in KNOBS or knob == "checkpoint_layers":
            valid = [k for k in KNOBS if k != "checkpoint_layers"] + ["checkpoint"]
            raise self._error(key, f"unknown knob; valid: {', '.join(valid)}")

    def _check_value(self, key: str, knob: str, value: Any) -> None:
        try:
            parse_knob(knob, _as_text(value))
        except UsageError as exc:
            raise self._error(key, str(exc)) from None

    def _parse_dimension(self, key: str, knob: str, spec: Any) -> Dimension:
        if not isinstance(spec, dict):
            raise self._error(key, "expected a mapping with choices, or low and high")
        unknown = sorted(set(spec) - _DIM_KEYS)
        if unknown:
            raise self._error(f"{key}.{unknown[0]}", f"unknown key; expected {', '.join(sorted(_DIM_KEYS))}")
        when = self._parse_condition(f"{key}.when", spec.get("when"))
        if "choices" in spec:
            choices = spec["choices"]
            if not isinstance(choices, list) or not choices:
                raise self._error(f"{key}.choices", "expected a non-empty list")
            for value in choices:
                self._check_value(f"{key}.choices", knob, value)
            return Dimension(knob, choices=tuple(choices), when=when)
        if "low" in spec and "high" in spec:
            low, high, step = spec["low"], spec["high"], spec.get("step", 1)
            if not isinstance(low, int) or not (isinstance(high, int) or high == "n_layer") or not isinstance(step, int):
                raise self._error(key, "low, high and step must be integers (high may be n_layer)")
            if isinstance(high, int) and high < low:
                raise self._error(key, f"high {high} is below low {low}")
            if knob in ("amp_dtype", "compile_mode", "sdpa_backend", "batching", "pin_memory", "persistent_workers"):
                raise self._error(key, "is categorical: give choices, not low/high")
            return Dimension(knob, low=low, high=high, log=bool(spec.get("log", False)), step=step, when=when)
        raise self._error(key, "expected choices, or low and high")

    def _parse_checkpoint(self, spec: Any) -> dict[str, Dimension]:
        key = "dimensions.checkpoint"
        if not isinstance(spec, dict) or set(spec) - {"count", "placement", "when"} or "count" not in spec:
            raise self._error(key, "expected {count: {low, high} or {choices}, placement: {choices: [first, last, spread]}}")
        count = self._parse_dimension(f"{key}.count", "num_workers", spec["count"])  # integer-valued like num_workers
        placement = spec.get("placement", {"choices": ["spread"]})
        if not isinstance(placement, dict) or set(placement) != {"choices"} or not set(placement["choices"]) <= set(PLACEMENTS):
            raise self._error(f"{key}.placement", f"expected {{choices: [...]}} with values from {', '.join(PLACEMENTS)}")
        return {"count": Dimension("checkpoint_count", count.choices, count.low, count.high, count.log, count.step),
                "placement": Dimension("checkpoint_placement", tuple(placement["choices"]))}

    def _parse_condition(self, key: str, cond: Any) -> Mapping[str, Any] | None:
        if cond is None:
            return None
        if not isinstance(cond, dict):
            raise self._error(key, "expected a mapping of knob -> value, [values] or {gt|ge|lt|le: n}")
        for knob, test in cond.items():
            self._check_knob(f"{key}.{knob}", knob)
            if isinstance(test, dict) and (set(test) - set(_OPS) or not test):
                raise self._error(f"{key}.{knob}", f"expected operators from {', '.join(_OPS)}")
        return cond

    def _parse_rule(self, key: str, rule: Any) -> Rule:
        if not isinstance(rule, dict) or set(rule) - {"when", "require", "reason"} or not {"when", "require"} <= set(rule):
            raise self._error(key, "expected {when: {...}, require: {...}, reason: text}")
        when = self._parse_condition(f"{key}.when", rule["when"])
        require = self._parse_condition(f"{key}.require", rule["require"])
        return Rule(when, require, str(rule.get("reason") or f"violates {key}"))

    def _check_against_model(self) -> None:
        """Values the model makes impossible are errors in the file, found before any trial."""
        budgets = self.dimensions.get("token_budget")
        if self.seq_len and budgets is not None:
            smallest = min(budgets.choices) if budgets.choices else budgets.low
            if smallest < self.seq_len:
                raise self._error("dimensions.token_budget", f"{smallest} is smaller than the context length {self.seq_len}: "
                                  "one full-length sequence must fit in a step")
        if self.checkpoint and self.n_layer is not None:
            count = self.checkpoint["count"]
            top = max(count.choices) if count.choices else count.high
            if isinstance(top, int) and top > self.n_layer:
                raise self._error("dimensions.checkpoint.count", f"{top} blocks, but the model has {self.n_layer}; use high: n_layer")

    # --- sampling ---------------------------------------------------------------------------

    def suggest(self, trial) -> TrainConfig:
        """Ask an Optuna trial for every active dimension; params are plain readable values."""
        values: dict[str, Any] = dict(self.fixed)
        for name, dim in self.dimensions.items():
            if dim.when and not self._matches(dim.when, values):
                continue
            values[name] = self._suggest_one(trial, dim)
        if self.checkpoint:
            count = self._suggest_one(trial, self.checkpoint["count"])
            placement = self._suggest_one(trial, self.checkpoint["placement"]) if count > 0 else "spread"
            values["checkpoint_layers"] = checkpoint_layers(count, placement, self.n_layer or count)
        return _to_config(values)

    def _suggest_one(self, trial, dim: Dimension) -> Any:
        if dim.choices is not None:
            return trial.suggest_categorical(dim.name, list(dim.choices))
        high = self.n_layer if dim.high == "n_layer" else dim.high
        if dim.log:
            return trial.suggest_int(dim.name, dim.low, high, log=True)
        return trial.suggest_int(dim.name, dim.low, high, step=dim.step)

    def violation(self, cfg: TrainConfig) -> str | None:
        """The reason of the first rule `cfg` breaks, or None."""
        values = cfg.to_dict()
        for rule in self.rules:
            if self._matches(rule.when, values) and not self._matches(rule.require, values):
                return rule.reason
        return None

    @staticmethod
    def _matches(cond: Mapping[str, Any], values: Mapping[str, Any]) -> bool:
        for knob, test in cond.items():
            value = values.get(knob)
            if isinstance(test, dict):
                if value is None or not all(_OPS[op](value, bound) for op, bound in test.items()):
                    return False
            elif isinstance(test, list):
                if value not in test:
                    return False
            elif value != test:
                return False
        return True

    def params_for(self, cfg: TrainConfig) -> dict[str, Any] | None:
        """The Optuna params that reproduce `cfg` in this space (for warm starts), or None
        when `cfg` lies outside it."""
        values = cfg.to_dict()
        params: dict[str, Any] = {}
        for knob, value in self.fixed.items():
            if values[knob] != value:
                return None
        for name, dim in self.dimensions.items():
            if dim.when and not self._matches(dim.when, values):
                continue
            if dim.choices is not None and values[name] not in dim.choices:
                return None
            params[name] = values[name]
        if self.checkpoint:
            layers = tuple(values["checkpoint_layers"])
            params["checkpoint_count"] = len(layers)
            if layers:
                placement = next((p for p in self.checkpoint["placement"].choices
                                  if checkpoint_layers(len(layers), p, self.n_layer or len(layers)) == layers), None)
                if placement is None:
                    return None
                params["checkpoint_placement"] = placement
        elif values["checkpoint_layers"]:
            return None
        return params

    # --- identity ---------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(self.raw, default=str))

    @property
    def hash(self) -> str:
        """Identifies the space's content (not its file name or comments) in a study."""
        canonical = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def checkpoint_layers(count: int, placement: str, n_layer: int) -> tuple[int, ...]:
    """The explicit block indices for `count` checkpointed blocks placed first/last/spread."""
    count = max(0, min(count, n_layer))
    if count == 0:
        return ()
    if placement == "first":
        return tuple(range(count))
    if placement == "last":
        return tuple(range(n_layer - count, n_layer))
    # spread: evenly over the depth, centred in each of `count` equal slices
    return tuple(sorted({int((i + 0.5) * n_layer / count) for i in range(count)}))


def _to_config(values: Mapping[str, Any]) -> TrainConfig:
    values = dict(values)
    if values.get("num_workers", 0) == 0:
        values.pop("prefetch_factor", None)
        values.pop("persistent_workers", None)
    return TrainConfig.from_dict(values)


def _as_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return "none" if value is None else str(value)
