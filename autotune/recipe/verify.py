"""`autotune verify`: re-measure a recipe here, in a fresh process with the same measuring
core as `search`, and judge it against what it recorded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autotune import registry
from autotune.config import DEFAULT_AGREE_TOKENS, GenerateSpec, RunSpec, check_runnable_here, check_workload_fits
from autotune.device import describe
from autotune.errors import UsageError
from autotune.measure import outcomes
from autotune.recipe.recipe import RECIPE_FIGURES, Recipe, recipe_measured
from autotune.recipe.run_verdict import CPU_TOLERANCE, GPU_TOLERANCE, default_tolerance  # noqa: F401 - verify's names
from autotune.trial.runner import run_trial
from autotune.units import format_bytes

DEFAULT_VERIFY_TIMEOUT_S = 1800.0


def model_to_verify(recipe: Recipe, model: str | None, *, allow_import: bool) -> str:
    """The model a verify (or a soak) of `recipe` builds: the recipe's own. A --model naming
    another is refused (UsageError): its measurement would be judged against the recorded
    figures of the recipe's model, a PASS or FAIL of nothing. --model naming the recipe's own
    model is how a user says they trust a recipe's `package.module:factory`."""
    recorded = recipe.model.get("name")
    if model and recorded and model != recorded:
        raise UsageError(
            f"--model {model!r} is not the recipe's model {recorded!r}: its figures were measured on "
            f"{recorded!r}, so they say nothing of {model!r}; drop --model, or verify a recipe of {model!r}"
        )
    return recipe.model_to_run(model, allow_import=allow_import)


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
    limit = recipe.measured.get("memory_limit_bytes")
    name = model_to_verify(recipe, model, allow_import=allow_model_import)
    check_runnable_here(recipe.config, where="the recipe's config")
    recipes_data = not data
    data = data or recipe.data or "synthetic"
    if recipes_data and data != "synthetic" and not Path(data).exists():
        raise UsageError(f"the recipe was measured on {data}, which is not here; give --data PATH (or synthetic)")
    seq_len = recipe.model.get("seq_len")
    check_recipe_runs(
        recipe,
        name,
        data=data,
        data_from_recipe=recipes_data,
        timeout_s=timeout_s,
        host_limit_bytes=limit if isinstance(limit, int) and device == "cpu" else None,
    )
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
        nproc_per_node=recipe.world_size,  # measured on N ranks: one launch of N again
    )


def check_recipe_runs(
    recipe: Recipe,
    name: str,
    *,
    data: str,
    data_from_recipe: bool,
    timeout_s: float,
    host_limit_bytes: int | None = None,
) -> None:
    """What a recipe asks of the model `name` and of its data, checked before any run starts
    (UsageError naming the recipe, exit 2): its checkpointed blocks exist in the model, its
    seq_len fits the model's context, its data is synthetic or a data file. Fields that load
    but cannot run would otherwise start a trial and fail it. The model's depth and context are
    autotune's own tables for its models; a user's factory or config directory is built in a
    child process first (`trial.probe`, under the timeout and a memory watchdog), which also
    reads the data. A built-in Hugging Face model is checked by its run."""
    from autotune.model.load import check_model_name, is_users_code
    from autotune.model.sizes import MODEL_SIZES

    where = f"recipe {recipe.source}" if recipe.source else "the recipe"
    seq_len = recipe.model.get("seq_len")
    if seq_len is not None and seq_len < 2:
        raise UsageError(f"{where}: model.seq_len: must be at least 2, got {seq_len}")
    if data != "synthetic":
        from autotune.data.datasets import check_data_spec

        try:
            check_data_spec(data)
        except UsageError as exc:
            raise UsageError(f"{where}: {exc}" if data_from_recipe else str(exc)) from None
    shape: tuple[int, int] | None = None
    if name in MODEL_SIZES:
        shape = MODEL_SIZES[name].n_layer, MODEL_SIZES[name].block_size
    elif is_users_code(name):  # a user's factory or config: built in a child first, its failures one line
        from autotune.trial.probe import probe

        probed = probe(name, data=data, seq_len=None, timeout_s=timeout_s, host_limit_bytes=host_limit_bytes)
        shape = probed.n_layer, probed.context_length
    else:
        check_model_name(name)
    if shape is None:
        return
    n_layer, context = shape
    if seq_len is not None and seq_len > context:
        raise UsageError(f"{where}: model.seq_len: {seq_len} is longer than {name}'s context of {context} tokens")
    beyond = [b for b in recipe.config.checkpoint_layers if b >= n_layer]
    if beyond:
        raise UsageError(
            f"{where}: config.checkpoint_layers: block {beyond[0]} does not exist, {name} has {n_layer} blocks "
            f"(0 to {n_layer - 1})"
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
    recorded_tps = _recorded_rate(recorded)
    if recipe.task == registry.GENERATE:
        if data is not None:
            raise UsageError("--data is for a training recipe; a generation recipe runs its own workload")
        return _verify_generation(
            recipe,
            recorded,
            device=device,
            tolerance=tolerance,
            steps=steps,
            warmup=warmup,
            min_time_s=min_time_s,
            timeout_s=timeout_s,
            model=model,
            allow_model_import=allow_model_import,
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
    return _judged(trial, recorded, recorded_tps, spec.memory_limit_bytes, tolerance)


def _recorded_rate(recorded: dict[str, Any]) -> float:
    """The recorded tokens/s, checked to be something to verify against."""
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
    return float(recorded_tps)


def _verify_generation(
    recipe: Recipe,
    recorded: dict[str, Any],
    *,
    device: str,
    tolerance: float,
    steps: int,
    warmup: int,
    min_time_s: float,
    timeout_s: float,
    model: str | None,
    allow_model_import: bool,
) -> dict[str, Any]:
    """A generation recipe measured again on its own workload (prompt lengths, new tokens, the
    correctness check), in a fresh process, and judged as a training recipe is: output tokens/s
    against the record, the memory limit, and an outcome that must be ok (a run that recompiled
    while timed, or left the float32 reference's tokens, fails); and its latencies, the p99 time per
    token and to the first token, each against the record (issue D, #13)."""
    from autotune.trial.generate import model_facts, run_generation_trial

    limit = recorded.get("memory_limit_bytes")
    limit = limit if isinstance(limit, int) else None
    name = model_to_verify(recipe, model, allow_import=allow_model_import)
    _, context, _ = model_facts(name, timeout_s=timeout_s, host_limit_bytes=limit if device == "cpu" else None)
    workload = recipe.workload
    spec = GenerateSpec(
        model=name,
        device=device,
        prompt_lens=tuple(workload["prompt_lens"]),
        new_tokens=workload["new_tokens"],
        warmup=warmup,
        steps=steps,
        min_time_s=min_time_s,
        memory_limit_bytes=limit,
        agree_tokens=workload.get("agree_tokens", DEFAULT_AGREE_TOKENS),
    )
    check_workload_fits(name, spec.longest_prompt, spec.new_tokens, context)
    trial = run_generation_trial(spec, recipe.config, timeout_s=timeout_s, device=describe(device))
    result = _judged(trial, recorded, float(recorded["tokens_per_sec"]), limit, tolerance)
    if trial.measurement is not None and trial.measurement.generation is not None:
        result["measured"]["generation"] = trial.measurement.generation
        late = outcomes.latency_failures(recorded.get("generation") or {}, trial.measurement.generation, tolerance)
        if late:
            result["passed"], result["reason"] = False, "; ".join(filter(None, [result["reason"], *late]))
    return result


def _judged(trial: Any, recorded: dict[str, Any], recorded_tps: float, limit: int | None, tolerance: float) -> dict:
    """A re-measurement against the record: the figures side by side, and why it fails (if it does)."""
    m = trial.measurement
    measured = recipe_measured(m, limit, recorded.get("memory_headroom")) if m else {}
    return _compared(trial.outcome, trial.reason, measured, recorded, recorded_tps, limit, tolerance)


def _compared(
    outcome: Any,
    reason: str | None,
    measured: dict[str, Any],
    recorded: dict[str, Any],
    recorded_tps: float,
    limit: int | None,
    tolerance: float,
) -> dict:
    """Measured figures (a re-measurement's, or a meter's of the user's run) beside the record's,
    and why they do not reproduce it (`outcomes.reproduction_failures`), if they do not."""
    tps, peak = measured.get("tokens_per_sec"), measured.get("peak_memory_bytes")
    recorded_peak = recorded.get("peak_memory_bytes")
    reasons = outcomes.reproduction_failures(
        outcome=outcome,
        reason=reason,
        tokens_per_sec=tps,
        recorded_tokens_per_sec=recorded_tps,
        tolerance=tolerance,
        peak_memory_bytes=peak,
        memory_limit_bytes=limit,
    )
    return {
        "recorded": recorded,
        "measured": measured,
        "ratio_tokens_per_sec": tps / recorded_tps if tps is not None else None,
        "ratio_peak_memory": peak / recorded_peak if peak is not None and recorded_peak else None,
        "tolerance": tolerance,
        "passed": not reasons,
        "outcome": outcome,
        "reason": "; ".join(reasons) or None,
    }


def verify_run_file(recipe: Recipe, run: dict[str, Any], *, tolerance: float | None = None) -> dict[str, Any]:
    """A meter's report of the user's own run (`recipe.meter`, `RunMeter.save`) judged against
    the recipe as a re-measurement is (`_judged`'s fields and rules: tokens/s within the
    tolerance, peak within the limit, no recompile while measured), the meter's own verdict
    beside it. Tolerance: the default of the device the run was metered on."""
    from autotune.recipe.run_verdict import judge

    check_run_file(run)
    recorded = dict(recipe.measured)
    recorded_tps = _recorded_rate(recorded)
    kind = run.get("device", {}).get("kind") or "cpu"
    tol = tolerance if tolerance is not None else default_tolerance(kind)
    limit = recorded.get("memory_limit_bytes")
    limit = limit if isinstance(limit, int) else None
    measured = {k: run.get(k) for k in RECIPE_FIGURES}
    recompiled = bool(run.get("recompiles_during_run"))
    outcome = outcomes.RECOMPILED if recompiled else outcomes.OK
    result = _compared(
        outcome, "torch compiled after warm-up" if recompiled else None, measured, recorded, recorded_tps, limit, tol
    )
    verdict = judge(run, recorded, device_kind=kind)
    if result["reason"] and verdict.causes:
        result["reason"] += f"; likely: {'; '.join(verdict.causes)}"
    return {**result, "outcome": str(outcome), "verdict": verdict.line}


def check_run_file(run: Any) -> None:
    """A meter report as `RunMeter.save` writes it: its format and version, and the figures the
    judgement reads of the right types; else UsageError naming the first that is not."""
    from autotune.recipe.meter import FORMAT, FORMAT_VERSION

    if not isinstance(run, dict) or run.get("format") != FORMAT or run.get("version") != FORMAT_VERSION:
        raise UsageError(f"--from: not a meter report ({FORMAT} version {FORMAT_VERSION}: what recipe.meter saves)")
    for key in ("tokens_per_sec", "peak_memory_bytes", "data_wait_fraction", "padding_fraction"):
        value = run.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
            raise UsageError(f"--from: {key} must be a number >= 0 or null, got {str(value)[:40]!r}")
    if not isinstance(run.get("device", {}), dict) or not isinstance(run.get("knobs_not_in_effect", []), list):
        raise UsageError("--from: device must be an object and knobs_not_in_effect a list")
