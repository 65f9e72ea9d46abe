"""Helpers shared by the benchmark scripts (not part of the package)."""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
from pathlib import Path
from typing import Any, Iterator, Sequence

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as `python benchmarks/x.py` from a checkout
    sys.path.insert(0, str(ROOT))

from autotune.config import TrainConfig  # noqa: E402
from autotune.errors import UsageError  # noqa: E402
from autotune.space.definition import Dimension, SearchSpace, checkpoint_layers, matches  # noqa: E402
from autotune.space.sampling import to_config  # noqa: E402


def dimension_values(space: SearchSpace, dim: Dimension) -> list[Any]:
    if dim.choices is not None:
        return list(dim.choices)
    high = space.n_layer if dim.high == "n_layer" else dim.high
    return list(range(dim.low, high + 1, 1 if dim.log else dim.step))


def enumerate_space(space: SearchSpace) -> Iterator[tuple[dict[str, Any], TrainConfig]]:
    """Every configuration of `space`, as (Optuna params, TrainConfig): the params `suggest`
    asks for, in its order. A conditional dimension is included only where its `when` holds
    (a knob the configuration does not set counts at its default), and a checkpoint placement
    only for a partial count (none is none, all is all)."""

    defaults = TrainConfig().to_dict()

    def walk(names: Sequence[str], values: dict[str, Any], params: dict[str, Any]):
        if not names:
            yield from checkpoints(values, params)
            return
        dim = space.dimensions[names[0]]
        if dim.when and not matches(dim.when, {**defaults, **values}):
            yield from walk(names[1:], values, params)
            return
        for v in dimension_values(space, dim):
            yield from walk(names[1:], {**values, dim.name: v}, {**params, dim.name: v})

    def checkpoints(values: dict[str, Any], params: dict[str, Any]):
        if not space.checkpoint:
            yield from configuration(params, values)
            return
        for count in dimension_values(space, space.checkpoint.count):
            n_layer = space.n_layer or count
            placements = list(space.checkpoint.placements) if 0 < count < n_layer else [None]
            for placement in placements:
                p = {**params, "checkpoint_count": count}
                if placement is not None:
                    p["checkpoint_placement"] = placement
                layers = checkpoint_layers(count, placement or "spread", n_layer)
                yield from configuration(p, {**values, "checkpoint_layers": layers})

    def configuration(params: dict[str, Any], values: dict[str, Any]):
        try:
            yield params, to_config(values)
        except UsageError:  # a combination the registry refuses (CUDA graphs, padded) is no configuration
            return

    yield from walk(list(space.dimensions), dict(space.fixed), {})


def is_configuration(config: dict[str, Any]) -> bool:
    """Whether the registry takes this combination (a sweep recorded before a rule was added
    holds some it now refuses, all `unsupported` by the space's own rule then)."""
    try:
        TrainConfig.from_dict(config)
    except UsageError:
        return False
    return True


def config_key(cfg: TrainConfig | dict[str, Any]) -> str:
    d = cfg.to_dict() if isinstance(cfg, TrainConfig) else TrainConfig.from_dict(cfg).to_dict()
    return json.dumps(d, sort_keys=True)


def machine() -> dict[str, Any]:
    import torch

    return {
        "host": platform.node(),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def cv(values: Sequence[float]) -> float:
    return statistics.pstdev(values) / statistics.fmean(values) if len(values) > 1 else 0.0


def md_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def mib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:.0f} MiB"
