"""Configurations as rows of numbers for the search's linear models (`throughput_model`,
`memory_model`): one column per knob value (one-hot, only where the knob takes effect), the
token budget's saturation curve and each budget's own column, the share of blocks checkpointed,
and the pairs of knobs known to interact. Each column carries its prior (mean, sd) from
`search.priors`, so a knob nobody wrote a prior for still gets a column, with a wide prior."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from autotune import registry
from autotune.search import priors

BUDGET, BLOCKS = "token_budget", "checkpoint_layers"
# Pairs of knobs whose effects are not additive (each pair's cells get a narrow prior around 0):
# the attention kernel with the dtype, CUDA graphs and autotuning with the batch's size and
# shape, and what compile covers with how the loss is computed.
INTERACTIONS = (
    ("amp_dtype", "sdpa_backend"),
    ("compile_mode", "batching"),
    ("compile_mode", BUDGET),
    ("compile_scope", "loss_impl"),
    ("amp_dtype", "compile_mode"),
)
INTERACTION_SD = 0.03


def active(knob: str, knobs: Mapping[str, Any]) -> bool:
    """Whether a knob's value takes effect with the others (compile_scope needs compile; worker
    knobs need workers)."""
    if knob == "compile_scope":
        return knobs.get("compile_mode", "none") != "none"
    declared = registry.BY_NAME.get(knob)
    return not (declared is not None and declared.inactive is not None and declared.inactive(knobs))


def value_key(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


@dataclass
class Columns:
    """The columns of a design matrix, fixed for a study: built from every configuration the
    search may see (its candidates), so each one's row has a place for each of its values."""

    device: str
    n_layer: int
    names: list[str] = field(default_factory=list)
    index: dict[tuple, int] = field(default_factory=dict)
    knobs: list[str] = field(default_factory=list)

    @classmethod
    def build(cls, configs: Iterable[Mapping[str, Any]], *, device: str, n_layer: int) -> "Columns":
        cols = cls(device, max(1, n_layer))
        cols._add(("intercept",))
        cols._add(("budget-curve",))
        cols._add(("checkpointed",))
        seen: dict[str, set] = {}
        budgets: set[int] = set()
        for c in configs:
            for knob, value in c.items():
                if knob == BUDGET:
                    budgets.add(int(value))
                elif knob != BLOCKS:
                    seen.setdefault(knob, set()).add(value_key(value))
        cols.knobs = [k for k in registry.names() if k in seen]
        for knob in cols.knobs:
            for value in sorted(seen[knob], key=repr):
                cols._add(("value", knob, value))
        for b in sorted(budgets):
            cols._add(("budget", b))
        for a, b in INTERACTIONS:
            va = sorted(seen.get(a, ()), key=repr) if a != BUDGET else sorted(budgets)
            vb = sorted(seen.get(b, ()), key=repr) if b != BUDGET else sorted(budgets)
            if len(va) > 1 and len(vb) > 1:
                for x in va:
                    for y in vb:
                        cols._add(("pair", a, x, b, y))
        return cols

    def _add(self, key: tuple) -> None:
        self.index[key] = len(self.names)
        self.names.append(key)

    def __len__(self) -> int:
        return len(self.names)

    def row(self, knobs: Mapping[str, Any]) -> np.ndarray:
        x = np.zeros(len(self.names))
        for j in self.indices(knobs):
            x[j[0]] += j[1]
        return x

    def indices(self, knobs: Mapping[str, Any]) -> list[tuple[int, float]]:
        out: list[tuple[int, float]] = [(self.index[("intercept",)], 1.0)]
        budget = int(knobs.get(BUDGET, 0) or 0)
        if budget > 0:
            out.append((self.index[("budget-curve",)], priors.budget_saturation(self.device, budget)))
            j = self.index.get(("budget", budget))
            if j is not None:
                out.append((j, 1.0))
        blocks = knobs.get(BLOCKS) or ()
        out.append((self.index[("checkpointed",)], len(blocks) / self.n_layer))
        for knob in self.knobs:
            if knob in knobs and active(knob, knobs):
                j = self.index.get(("value", knob, value_key(knobs[knob])))
                if j is not None:
                    out.append((j, 1.0))
        for a, b in INTERACTIONS:
            if a in knobs and b in knobs and active(a, knobs) and active(b, knobs):
                j = self.index.get(("pair", a, value_key(knobs[a]), b, value_key(knobs[b])))
                if j is not None:
                    out.append((j, 1.0))
        return out

    def matrix(self, configs: Sequence[Mapping[str, Any]]) -> np.ndarray:
        X = np.zeros((len(configs), len(self.names)), dtype=np.float64)
        for i, c in enumerate(configs):
            for j, v in self.indices(c):
                X[i, j] += v
        return X

    def throughput_prior(self, loader_sd: float) -> tuple[np.ndarray, np.ndarray]:
        """Prior (mean, sd) of every column's effect on log tokens/s."""
        mean, sd = np.zeros(len(self.names)), np.zeros(len(self.names))
        for j, key in enumerate(self.names):
            kind = key[0]
            if kind == "intercept":
                mean[j], sd[j] = math.log(1e5 if self.device != priors.CPU else 1e4), 4.0
            elif kind == "budget-curve":
                mean[j], sd[j] = 1.0, priors.BUDGET_CURVE_SD
            elif kind == "checkpointed":
                mean[j], sd[j] = priors.CHECKPOINT_COST
            elif kind == "budget":
                mean[j], sd[j] = 0.0, priors.BUDGET_VALUE_SD
            elif kind == "value":
                _, knob, value = key
                m, s = priors.knob_prior(self.device, knob, value)
                declared = registry.BY_NAME.get(knob)
                if declared is not None and declared.role is registry.Role.LOADER:
                    s = loader_sd
                mean[j], sd[j] = m, s
            else:
                mean[j], sd[j] = 0.0, INTERACTION_SD
        return mean, sd
