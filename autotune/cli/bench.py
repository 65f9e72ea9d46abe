"""`autotune bench`: measure one configuration."""

from __future__ import annotations

import sys

import click

from autotune.cli._options import (
    CONTEXT_SETTINGS,
    emit_json,
    global_batch_option,
    json_option,
    memory_limit_option,
    run_options,
    say,
    stdout_to_stderr,
)

PROBE_TIMEOUT_S = 300.0


def _run_spec(
    model: str,
    device: str,
    data: str,
    seq_len: int | None,
    warmup: int,
    steps: int,
    min_time: float,
    seed: int,
    memory_limit: int | None = None,
    global_batch_tokens: int | None = None,
):
    from autotune.config import RunSpec
    from autotune.device import resolve_device
    from autotune.model.load import check_model_name, is_users_code

    if is_users_code(model):
        # A user's factory (or config directory) is built first in a child process, under a
        # timeout: one that raises, exits or hangs is one line (exit 2), not a traceback or a
        # hang. autotune's own models are not: the child would import torch (and transformers)
        # a second time only to build what this process builds next.
        from autotune.trial.probe import probe

        on_cpu = resolve_device(device) == "cpu"
        probe(
            model,
            data=data,
            seq_len=seq_len,
            timeout_s=PROBE_TIMEOUT_S,
            host_limit_bytes=memory_limit if on_cpu else None,
        )
    else:
        check_model_name(model)
    return RunSpec(
        model=model,
        device=resolve_device(device),
        data=data,
        seq_len=seq_len,
        warmup=warmup,
        steps=steps,
        min_time_s=min_time,
        seed=seed,
        memory_limit_bytes=memory_limit,
        global_batch_tokens=global_batch_tokens,
    )


@click.command(context_settings=CONTEXT_SETTINGS)
@run_options
@click.option(
    "--batching",
    type=click.Choice(["fixed", "padded", "packed"]),
    default=None,
    help="Batching mode (same as --set batching=...).",
)
@click.option(
    "--set",
    "assignments",
    multiple=True,
    metavar="KNOB=VALUE",
    help="Set a knob, e.g. --set amp_dtype=bfloat16 (repeatable).",
)
@memory_limit_option
@global_batch_option
@json_option
def bench(
    model,
    device,
    data,
    seq_len,
    warmup,
    steps,
    min_time,
    seed,
    batching,
    assignments,
    memory_limit,
    global_batch_tokens,
    as_json,
) -> None:
    """Measure one configuration: effective tokens/s, memory, MFU and their spread.

    Knobs: num_workers, prefetch_factor, pin_memory, persistent_workers, token_budget,
    batching, amp_dtype, compile_mode, sdpa_backend, checkpoint_layers.
    """
    from autotune.config import TrainConfig, accumulation_for, check_runnable_here, parse_assignments
    from autotune.errors import UnsupportedConfig, UsageError
    from autotune.measure import outcomes
    from autotune.measure.loop import measure
    from autotune.present.summaries import format_measurement

    overrides = parse_assignments(assignments)
    if batching:
        overrides["batching"] = batching
    cfg = TrainConfig().with_overrides(overrides)
    check_runnable_here(cfg, where="--set")
    try:
        accumulation_for(global_batch_tokens, cfg)
    except UnsupportedConfig as exc:  # the user's own numbers and knobs: a usage error, at once
        raise UsageError(f"--global-batch-tokens: {exc}") from None
    spec = _run_spec(model, device, data, seq_len, warmup, steps, min_time, seed, memory_limit, global_batch_tokens)
    with stdout_to_stderr(as_json):  # the model's prints: stdout is for the JSON alone
        result = measure(spec, cfg)
    if as_json:
        emit_json(result.to_dict())
    else:
        say(format_measurement(result))
    sys.exit(0 if result.outcome == outcomes.OK else 1)
