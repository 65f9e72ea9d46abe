"""`autotune bench`: measure one configuration."""

from __future__ import annotations

import sys

import click

from autotune.cli._options import CONTEXT_SETTINGS, emit_json, json_option, say, settings_options, stdout_to_stderr
from autotune.search.settings import SearchSettings

# What to run and on what: `search`'s options (search.settings), declared there once.
RUN_OPTIONS = ("model", "device", "data", "seq_len", "warmup", "steps", "min_time_s", "seed")
# The generation workload's options, declared once with `search`'s too.
GENERATION_OPTIONS = ("task", "prompt_len", "prompts", "new_tokens", "agree_tokens")

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
@settings_options(SearchSettings, *RUN_OPTIONS)
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
@settings_options(SearchSettings, "memory_limit_bytes", "global_batch_tokens", *GENERATION_OPTIONS)
@json_option
def bench(
    model,
    device,
    data,
    seq_len,
    warmup,
    steps,
    min_time_s,
    seed,
    batching,
    assignments,
    memory_limit_bytes,
    global_batch_tokens,
    as_json,
    **generation,
) -> None:
    """Measure one configuration: effective tokens/s, memory, MFU and their spread.

    Knobs: num_workers, prefetch_factor, pin_memory, persistent_workers, token_budget,
    batching, amp_dtype, compile_mode, sdpa_backend, checkpoint_layers.

    With --task generate: output tokens/s, time to first token and per token (p50, p99),
    prefill tokens/s, memory and the correctness check of one generation configuration; --steps
    and --warmup count whole generations. Knobs: kv_cache, decode_compile, compile_prefill,
    prefill_sdpa, decode_sdpa, dtype, batch_size, prompt_bucket.
    """
    if generation["task"] == "generate":
        trained = {"--batching": batching, "--data": data != "synthetic", "--seq-len": seq_len}
        _refuse_given({**trained, "--global-batch-tokens": global_batch_tokens}, "--task train (the default)")
        _bench_generation(
            model, device, warmup, steps, min_time_s, seed, assignments, memory_limit_bytes, as_json, generation
        )
        return
    flags = {"prompt_len": "--prompt-len", "prompts": "--prompts", "new_tokens": "--new-tokens"}
    flags["agree_tokens"] = "--agree-tokens"
    _refuse_given({flag: generation[name] is not None for name, flag in flags.items()}, "--task generate")
    from autotune.config import TrainConfig, accumulation_for, check_runnable_here, parse_assignments
    from autotune.errors import UnsupportedConfig, UsageError

    # The knobs are read and checked first, without torch (its import takes seconds, tens on a
    # busy machine): a bad --set is one line at once, as any other bad option.
    overrides = parse_assignments(assignments)
    if batching:
        overrides["batching"] = batching
    cfg = TrainConfig().with_overrides(overrides)
    check_runnable_here(cfg, where="--set")
    try:
        accumulation_for(global_batch_tokens, cfg)
    except UnsupportedConfig as exc:  # the user's own numbers and knobs: a usage error, at once
        raise UsageError(f"--global-batch-tokens: {exc}") from None
    from autotune.measure import outcomes
    from autotune.measure.loop import measure  # torch
    from autotune.present.summaries import format_measurement

    spec = _run_spec(
        model, device, data, seq_len, warmup, steps, min_time_s, seed, memory_limit_bytes, global_batch_tokens
    )
    with stdout_to_stderr(as_json):  # the model's prints: stdout is for the JSON alone
        result = measure(spec, cfg)
    _show(result, format_measurement, as_json)
    sys.exit(0 if result.outcome == outcomes.OK else 1)


def _show(result, formatted, as_json: bool) -> None:
    """The measurement, and beside it (on stderr) whether the host was busy while it ran."""
    from autotune.device.info import busy_host

    if as_json:
        emit_json(result.to_dict())
    else:
        say(formatted(result))
    if busy := busy_host():
        click.echo(f"Warning: {busy}", err=True)


def _refuse_given(given: dict[str, object], task: str) -> None:
    """UsageError for the first option given (a truthy value) that belongs to `task`."""
    flags = [flag for flag, value in given.items() if value]
    if flags:
        from autotune.errors import UsageError

        raise UsageError(f"{flags[0]} is an option of {task}")


def _bench_generation(
    model, device, warmup, steps, min_time, seed, assignments, memory_limit, as_json, options
) -> None:
    """`bench --task generate`: one generation configuration measured in this process."""
    from autotune import registry
    from autotune.config import (
        DEFAULT_AGREE_TOKENS,
        GenerateConfig,
        GenerateSpec,
        parse_assignments,
    )

    # The knobs first, without torch: a bad --set is one line at once (see `bench`).
    cfg = GenerateConfig().with_overrides(parse_assignments(assignments, task=registry.GENERATE))
    from autotune.device import resolve_device
    from autotune.measure import outcomes
    from autotune.measure.generation import measure_generation  # torch
    from autotune.present.generation import format_generation_measurement
    from autotune.search.generate import resolve_workload

    device = resolve_device(device)
    on_cpu = device == "cpu"
    workload = resolve_workload(
        model,
        options["prompt_len"],
        options["prompts"],
        options["new_tokens"],
        timeout_s=PROBE_TIMEOUT_S,
        host_limit_bytes=memory_limit if on_cpu else None,
        in_child=False,
    )
    spec = GenerateSpec(
        model=model,
        device=device,
        prompt_lens=workload.lens,
        new_tokens=workload.new_tokens,
        warmup=warmup,
        steps=steps,
        min_time_s=min_time,
        seed=seed,
        memory_limit_bytes=memory_limit,
        agree_tokens=options["agree_tokens"] or DEFAULT_AGREE_TOKENS,
    )
    with stdout_to_stderr(as_json):
        result = measure_generation(spec, cfg)
    _show(result, format_generation_measurement, as_json)
    sys.exit(0 if result.outcome == outcomes.OK else 1)
