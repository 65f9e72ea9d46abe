"""`verify --soak` as text: throughput and peak memory per window, then the memory's maximum,
growth and creep against the limit less the headroom, and the verdict."""

from __future__ import annotations

from typing import Any

from autotune.errors import printable
from autotune.units import format_bytes


def _bytes(value: int | float | None) -> str:
    return format_bytes(int(value)) if value is not None else "-"


def format_soak(result: dict[str, Any], recipe_path: str) -> str:
    steps, epoch = result.get("steps") or 0, result.get("epoch_steps")
    shapes = f"{result.get('shapes_seen', 0)} of {result.get('shapes_total') or '?'} batch shapes"
    lines = [f"soak of {printable(recipe_path)}: {steps} steps (an epoch is {epoch} batches), {shapes}"]
    windows = result.get("windows") or []
    if windows:
        lines.append(f"  {'steps':>8}  {'tokens/s':>12}  {'peak memory':>12}")
        for w in windows:
            lines.append(f"  {w['end_step']:>8}  {w['tokens_per_sec']:>12,.0f}  {_bytes(w['peak_memory_bytes']):>12}")
    slope = result.get("slope_bytes_per_step")
    creep = f"{_bytes(slope * 1000)} per 1000 steps" if slope is not None and slope >= 0 else "none"
    if slope is not None and slope < 0:
        creep = f"none (falls {_bytes(-slope * 1000)} per 1000 steps)"
    lines.append(
        f"max memory {_bytes(result.get('max_memory_bytes'))}, growth {_bytes(result.get('memory_growth_bytes'))}; "
        f"creep over the second half: {creep}"
    )
    target = result.get("memory_target_bytes")
    if target is not None:
        lines.append(
            f"target {_bytes(target)} (limit {_bytes(result.get('memory_limit_bytes'))} less "
            f"{result.get('memory_headroom', 0):.0%}); projected at {result.get('creep_horizon_steps')} steps: "
            f"{_bytes(result.get('projected_memory_bytes'))}"
        )
    else:
        lines.append("the recipe records no memory limit: growth reported, not judged")
    lines.append("PASS" if result.get("passed") else f"FAIL: {printable(result.get('reason'))}")
    return "\n".join(lines)
