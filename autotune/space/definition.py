"""A search space as a value: what is fixed, what the sampler chooses, and the rules.

Built and validated once by `space_file.load_space` from a YAML file; sampled by
`sampling.suggest`. Everything here is plain data plus the two questions a study asks of a
space: does a configuration break a rule (`violation`), and what is its identity (`hash`)."""

from __future__ import annotations

import hashlib
import json
import operator
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from autotune.config import TrainConfig

PLACEMENTS = ("first", "last", "spread")
COMPARISONS: dict[str, Callable[[Any, Any], bool]] = {
    "gt": operator.gt,
    "ge": operator.ge,
    "lt": operator.lt,
    "le": operator.le,
}


@dataclass(frozen=True)
class Dimension:
    """One knob the sampler chooses: from `choices`, or an integer in low..high."""

    name: str
    choices: tuple[Any, ...] | None = None
    low: int | None = None
    high: int | str | None = None  # "n_layer": the model's block count (resolved when the space is bound to a model)
    log: bool = False
    step: int = 1
    when: Mapping[str, Any] | None = None  # only sampled when this condition holds


@dataclass(frozen=True)
class CheckpointDimension:
    """The checkpointed blocks, searched as how many (`count`) and where (`placements`), and
    recorded as explicit block indices (`checkpoint_layers`)."""

    count: Dimension  # named checkpoint_count
    placements: tuple[str, ...] = ("spread",)


@dataclass(frozen=True)
class Rule:
    when: Mapping[str, Any]
    require: Mapping[str, Any]
    reason: str


@dataclass(frozen=True)
class SearchSpace:
    """A validated space, bound to a model's block count and context length."""

    source: str
    raw: Mapping[str, Any]
    fixed: Mapping[str, Any] = field(default_factory=dict)
    dimensions: Mapping[str, Dimension] = field(default_factory=dict)
    checkpoint: CheckpointDimension | None = None
    rules: tuple[Rule, ...] = ()
    n_layer: int | None = None
    seq_len: int | None = None

    def violation(self, cfg: TrainConfig) -> str | None:
        """The reason of the first rule `cfg` breaks, or None."""
        values = cfg.to_dict()
        for rule in self.rules:
            if matches(rule.when, values) and not matches(rule.require, values):
                return rule.reason
        return None

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(self.raw, default=str))

    @property
    def hash(self) -> str:
        """Identifies the space's content (not its file name or comments) in a study."""
        canonical = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def matches(condition: Mapping[str, Any], values: Mapping[str, Any]) -> bool:
    """Whether knob `values` meet a condition: knob -> value, [values] or {gt|ge|lt|le: n}."""
    for knob, test in condition.items():
        value = values.get(knob)
        if isinstance(test, dict):
            if value is None or not all(COMPARISONS[op](value, bound) for op, bound in test.items()):
                return False
        elif isinstance(test, list):
            if value not in test:
                return False
        elif value != test:
            return False
    return True


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
