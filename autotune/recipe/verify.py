"""`autotune verify`: re-measure a recipe here, in a fresh process with the same measuring
core as `search`, and judge it against what it recorded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autotune.config import RunSpec, check_runnable_here
from autotune.device import describe
from autotune.errors import UsageError
from autotune.measure import outcomes
from autotune.recipe.recipe import Recipe, recipe_measured
from autotune.trial.runner import run_trial
from autotune.units import format_bytes

DEFAULT_VERIFY_TIMEOUT_S = 1800.0


# A GPU step is long and steady: a recipe should reproduce within a few percent. On a CPU,
# fresh processes of the same configuration spread by 6-12% (coefficient of variation, 2-core
# VM, benchmarks/fidelity.py), so 5% would fail a faithful recipe about half the time.
GPU_TOLERANCE, CPU_TOLERANCE = 0.05, 0.15


def default_tolerance(device: str) -> float:
    return CPU_TOLERANCE if device.split(":", 1)[0] == "cpu" else GPU_TOLERANCE


def recipe_run_spec(
    recipe: Recipe,
    *,
    device: str,
    data: str | None,
    warmup: int,
    steps: int,
    min_time_s: float,
    timeout_s: float,
    model: str | None,
    allow_model_import: bool,
) -> RunSpec:
    """The run of `recipe` here, checked before anything runs: the model (a user's factory
    or config directory is built in a child process first, under the timeout), the data, the
    workers this machine can start; the recipe's memory limit and global batch."""
    from autotune.model.load import check_model_name, is_users_code

    limit = recipe.measured.get("memory_limit_bytes")
    name = recipe.model_to_run(model, allow_import=allow_model_import)
    check_runnable_here(recipe.config, where="the recipe's config")
    data = data or recipe.data or "synthetic"
    if data != "synthetic" and not Path(data).is_file():
        raise UsageError(f"the recipe was measured on {data}, which is not here; give --data PATH (or synthetic)")
    seq_len = recipe.model.get("seq_len")
    if is_users_code(name):  # a user's factory or config: built in a child first, its failures one line
        from autotune.trial.probe import probe

        probe(
            name,
            data=data,
            seq_len=seq_len if isinstance(seq_len, int) else None,
            timeout_s=timeout_s,
            host_limit_bytes=limit if isinstance(limit, int) and device == "cpu" else None,
        )
    else:
        check_model_name(name)
    return RunSpec(
        model=name,
        device=device,
        data=data,
        seq_len=seq_len if isinstance(seq_len, int) else None,
        warmup=warmup,
        steps=steps,
        min_time_s=min_time_s,
        memory_limit_bytes=limit if isinstance(limit, int) else None,
        global_batch_tokens=recipe.global_batch_tokens,  # measured accumulating: verified so
    )


def verify_recipe(
    recipe: Recipe,
    *,
    device: str,
    tolerance: float,
    steps: int,
    warmup: int,
    min_time_s: float = 2.0,
    data: str | None = None,
    timeout_s: float = DEFAULT_VERIFY_TIMEOUT_S,
    model: str | None = None,
    allow_model_import: bool = False,
) -> dict[str, Any]:
    """Measure the recipe's config with `trial.runner.run_trial`, in a fresh process with the
    measuring core of `search`, and judge it against the record (`outcomes`). Everything is
    checked first, nothing runs on a refusal: the model (the recipe's own `package.module:
    factory` only with `allow_model_import`, or `model` instead; a factory is built in a child
    process first, under the timeout), the data, the workers this machine can start, and the
    record itself (a limit below its own peak is a recipe that cannot pass)."""
    recorded = dict(recipe.measured)
    recorded_tps = recorded.get("tokens_per_sec")
    if not isinstance(recorded_tps, (int, float)) or recorded_tps <= 0:
        raise UsageError("the recipe records no tokens_per_sec (measured.tokens_per_sec): nothing to verify against")
    limit = recorded.get("memory_limit_bytes")
    recorded_peak = recorded.get("peak_memory_bytes")
    if isinstance(limit, int) and isinstance(recorded_peak, int) and recorded_peak > limit:
        raise UsageError(
            f"the recipe records a peak of {format_bytes(recorded_peak)} above its own memory limit "
            f"{format_bytes(limit)} (measured.memory_limit_bytes): it is inconsistent, there is nothing to verify"
        )
    spec = recipe_run_spec(
        recipe,
        device=device,
        data=data,
        warmup=warmup,
        steps=steps,
        min_time_s=min_time_s,
        timeout_s=timeout_s,
        model=model,
        allow_model_import=allow_model_import,
    )
    trial = run_trial(spec, recipe.config, timeout_s=timeout_s, device=describe(device))
    m = trial.measurement
    measured = recipe_measured(m, spec.memory_limit_bytes, recorded.get("memory_headroom")) if m else {}
    tps, peak = measured.get("tokens_per_sec"), measured.get("peak_memory_bytes")
    recorded_peak = recorded.get("peak_memory_bytes")
    ratio_tps = tps / recorded_tps if tps is not None else None
    ratio_peak = peak / recorded_peak if peak is not None and recorded_peak else None
    reasons = outcomes.reproduction_failures(
        outcome=trial.outcome,
        reason=trial.reason,
        tokens_per_sec=tps,
        recorded_tokens_per_sec=recorded_tps,
        tolerance=tolerance,
        peak_memory_bytes=peak,
        memory_limit_bytes=spec.memory_limit_bytes,
    )
    return {
        "recorded": recorded,
        "measured": measured,
        "ratio_tokens_per_sec": ratio_tps,
        "ratio_peak_memory": ratio_peak,
        "tolerance": tolerance,
        "passed": not reasons,
        "outcome": trial.outcome,
        "reason": "; ".join(reasons) or None,
    }
