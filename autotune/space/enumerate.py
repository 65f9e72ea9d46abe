"""Every configuration of a space, or a random sample of them when there are too many: what the
search's models score (`search.planner`) and what a recorded sweep replays
(benchmarks/_common.enumerate_space). Yields (Optuna params, TrainConfig) pairs, the params being
exactly what `sampling.suggest` asks an Optuna trial for. Torch-free."""

from __future__ import annotations

import math
import random
from typing import Any, Iterator, Sequence

from autotune.config import TrainConfig
from autotune.errors import UsageError
from autotune.space.definition import Dimension, SearchSpace, checkpoint_layers, matches
from autotune.space.sampling import to_config

Pair = tuple[dict[str, Any], TrainConfig]


def dimension_values(space: SearchSpace, dim: Dimension) -> list[Any]:
    if dim.choices is not None:
        return list(dim.choices)
    high = space.n_layer if dim.high == "n_layer" else dim.high
    if dim.log:  # every integer of a log range would be too many: its powers of two, and both ends
        values = {dim.low, high} | {2**k for k in range(int(math.log2(max(dim.low, 1))), int(math.log2(high)) + 1)}
        return sorted(v for v in values if dim.low <= v <= high)
    return list(range(dim.low, high + 1, dim.step))


def _checkpoint_options(space: SearchSpace) -> list[tuple[int, str | None]]:
    if not space.checkpoint:
        return [(0, None)]
    options = []
    for count in dimension_values(space, space.checkpoint.count):
        n_layer = space.n_layer or count
        if 0 < count < n_layer:
            options += [(count, placement) for placement in space.checkpoint.placements]
        else:
            options.append((count, None))
    return options


def configurations(space: SearchSpace) -> Iterator[Pair]:
    """Every configuration of `space` as (params, TrainConfig), in `suggest`'s order. A conditional
    dimension is included only where its `when` holds (a knob the configuration does not set
    counts at its default), and a checkpoint placement only for a partial count. A combination
    the knobs' own rules refuse (`registry`: TrainConfig will not hold it) is no configuration."""
    defaults = TrainConfig().to_dict()
    names = list(space.dimensions)
    checkpoints = _checkpoint_options(space)

    def walk(i: int, values: dict[str, Any], params: dict[str, Any]) -> Iterator[Pair]:
        if i == len(names):
            for count, placement in checkpoints:
                try:
                    yield _with_checkpoint(space, values, params, count, placement)
                except UsageError:  # a combination the knobs' own rules refuse (CUDA graphs, padded)
                    continue
            return
        dim = space.dimensions[names[i]]
        if dim.when and not matches(dim.when, {**defaults, **values}):
            yield from walk(i + 1, values, params)
            return
        for v in dimension_values(space, dim):
            yield from walk(i + 1, {**values, dim.name: v}, {**params, dim.name: v})

    yield from walk(0, dict(space.fixed), {})


def _with_checkpoint(
    space: SearchSpace, values: dict[str, Any], params: dict[str, Any], count: int, placement: str | None
) -> Pair:
    if not space.checkpoint:
        return params, to_config(values)
    p = {**params, "checkpoint_count": count}
    if placement is not None:
        p["checkpoint_placement"] = placement
    layers = checkpoint_layers(count, placement or "spread", space.n_layer or count)
    return p, to_config({**values, "checkpoint_layers": layers})


def size(space: SearchSpace, cap: int = 10**9) -> int:
    """How many configurations `space` has (counted up to `cap`, cheaply: no TrainConfig is built)."""
    defaults = TrainConfig().to_dict()
    names = list(space.dimensions)
    per_checkpoint = len(_checkpoint_options(space))

    def count(i: int, values: dict[str, Any]) -> int:
        if i == len(names):
            return per_checkpoint
        dim = space.dimensions[names[i]]
        if dim.when and not matches(dim.when, {**defaults, **values}):
            return count(i + 1, values)
        total = 0
        for v in dimension_values(space, dim):
            total += count(i + 1, {**values, dim.name: v})
            if total > cap:
                return total
        return total

    return count(0, dict(space.fixed))


def sample(space: SearchSpace, n: int, seed: int, *, around: Sequence[TrainConfig] = ()) -> list[Pair]:
    """About `n` distinct configurations drawn at random (each dimension uniformly, in `suggest`'s
    order), plus every configuration one knob away from each of `around`."""
    rng = random.Random(seed)
    defaults = TrainConfig().to_dict()
    checkpoints = _checkpoint_options(space)
    seen: dict[str, Pair] = {}

    def draw(fixed_choice: dict[str, Any] | None = None) -> Pair | None:
        values, params = dict(space.fixed), {}
        for name, dim in space.dimensions.items():
            if dim.when and not matches(dim.when, {**defaults, **values}):
                continue
            options = dimension_values(space, dim)
            v = fixed_choice[name] if fixed_choice and name in fixed_choice and fixed_choice[name] in options else None
            v = v if v is not None else rng.choice(options)
            values[name], params[name] = v, v
        count, placement = rng.choice(checkpoints)
        if fixed_choice and "checkpoint_layers" in fixed_choice:
            layers = fixed_choice["checkpoint_layers"]
            match = [o for o in checkpoints if _layers_of(space, *o) == tuple(layers)]
            count, placement = match[0] if match else (count, placement)
        try:
            return _with_checkpoint(space, values, params, count, placement)
        except UsageError:  # a combination TrainConfig refuses is not a configuration
            return None

    for _ in range(4 * n):
        if len(seen) >= n:
            break
        pair = draw()
        if pair is not None:
            seen.setdefault(_key(pair[1]), pair)
    for cfg in around:
        base = cfg.to_dict()
        for name, dim in space.dimensions.items():
            for v in dimension_values(space, dim):
                pair = draw({**base, name: v})
                if pair is not None:
                    seen.setdefault(_key(pair[1]), pair)
    return list(seen.values())


def _layers_of(space: SearchSpace, count: int, placement: str | None) -> tuple[int, ...]:
    return checkpoint_layers(count, placement or "spread", space.n_layer or count)


def _key(cfg: TrainConfig) -> str:
    import json

    return json.dumps(cfg.to_dict(), sort_keys=True)
