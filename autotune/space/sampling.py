"""From a space to configurations and back: `suggest` asks an Optuna trial for every active
dimension; `params_for` finds the params that reproduce a configuration (warm starts), and
`outside_reason` says why a configuration lies outside a space."""

from __future__ import annotations

from typing import Any, Mapping

from autotune import registry
from autotune.config import TrainConfig, knob_text
from autotune.space.definition import Dimension, SearchSpace, checkpoint_layers, matches


def suggest(space: SearchSpace, trial) -> TrainConfig:
    """Ask an Optuna trial for every active dimension; params are plain readable values."""
    values: dict[str, Any] = dict(space.fixed)
    defaults = TrainConfig().to_dict()
    for name, dim in space.dimensions.items():
        # A condition on a knob this trial does not set sees the knob's default, as
        # params_for (which reads a whole TrainConfig) does.
        if dim.when and not matches(dim.when, {**defaults, **values}):
            continue
        values[name] = _suggest_one(space, trial, dim)
    if space.checkpoint:
        count = _suggest_one(space, trial, space.checkpoint.count)
        n_layer = space.n_layer or count
        # Where the blocks go matters only for a partial count: none is none, all is all.
        placement = (
            trial.suggest_categorical("checkpoint_placement", list(space.checkpoint.placements))
            if 0 < count < n_layer
            else "spread"
        )
        values["checkpoint_layers"] = checkpoint_layers(count, placement, n_layer)
    return to_config(values)


def _suggest_one(space: SearchSpace, trial, dim: Dimension) -> Any:
    if dim.choices is not None:
        return trial.suggest_categorical(dim.name, list(dim.choices))
    high = _high(space, dim)
    if dim.log:
        return trial.suggest_int(dim.name, dim.low, high, log=True)
    return trial.suggest_int(dim.name, dim.low, high, step=dim.step)


def _high(space: SearchSpace, dim: Dimension) -> int | None:
    return space.n_layer if dim.high == "n_layer" else dim.high


def to_config(values: Mapping[str, Any]) -> TrainConfig:
    """Knob values -> a TrainConfig; a knob the others make meaningless (`Knob.inactive`: worker-only
    knobs without workers) takes its default."""
    values = dict(values)
    for knob in registry.knobs_of(registry.TRAIN):
        if knob.inactive is not None and knob.inactive(values):
            values.pop(knob.name, None)  # meaningless with the others (prefetch without workers): its default
    return TrainConfig.from_dict(values)


def params_for(space: SearchSpace, cfg: TrainConfig) -> dict[str, Any] | None:
    """The Optuna params that reproduce `cfg` in this space (for warm starts), or None when
    `cfg` lies outside it."""
    values = cfg.to_dict()
    params: dict[str, Any] = {}
    for knob, value in space.fixed.items():
        if values[knob] != value:
            return None
    for name, dim in space.dimensions.items():
        if dim.when and not matches(dim.when, values):
            continue
        if dim.choices is not None and values[name] not in dim.choices:
            return None
        params[name] = values[name]
    if space.checkpoint:
        layers = tuple(values["checkpoint_layers"])
        counts = space.checkpoint.count.choices
        if counts is not None and len(layers) not in counts:  # e.g. a partial count where none is searched
            return None
        params["checkpoint_count"] = len(layers)
        if 0 < len(layers) < (space.n_layer or len(layers)):
            placement = next(
                (
                    p
                    for p in space.checkpoint.placements
                    if checkpoint_layers(len(layers), p, space.n_layer or len(layers)) == layers
                ),
                None,
            )
            if placement is None:
                return None
            params["checkpoint_placement"] = placement
    elif values["checkpoint_layers"]:
        return None
    return params


def outside_reason(cfg: TrainConfig, space: SearchSpace) -> str:
    """Which knob puts `cfg` outside `space`, as far as can be said simply."""
    values = cfg.to_dict()
    for knob, value in space.fixed.items():
        if values.get(knob) != value:
            return f"outside this search space (it fixes {knob}={knob_text(value)})"
    for name, dim in space.dimensions.items():
        value = values.get(name)
        if dim.choices is not None and value not in dim.choices and (not dim.when or matches(dim.when, values)):
            return f"outside this search space ({name} not among {', '.join(map(knob_text, dim.choices))})"
        if dim.choices is None and isinstance(value, int):
            high = _high(space, dim)
            if not dim.low <= value <= high or (value - dim.low) % dim.step:
                return f"outside this search space ({name} not in {dim.low}..{high} step {dim.step})"
    return "outside this search space"
