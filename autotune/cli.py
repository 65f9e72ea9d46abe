"""The `autotune` command line. Commands are thin: they parse, call the library, print.
Errors from the library become one line on stderr and an exit code (2: bad input)."""

from __future__ import annotations

import functools
import json
import logging
import sys
from typing import Any, Callable

import click

from autotune import __version__
from autotune.errors import AutotuneError

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def handle_errors(command: Callable) -> Callable:
    """Turn autotune's exceptions into `Error: <one line>` and the error's exit code."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except AutotuneError as exc:
            click.echo(f"Error: {exc}", err=True)
            sys.exit(exc.exit_code)

    return wrapper


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


@click.group(context_settings=CONTEXT_SETTINGS)
@click.version_option(__version__, "-V", "--version", prog_name="autotune")
@click.option("-v", "--verbose", is_flag=True, help="Log what autotune decides (tokenizer, NVML, ...).")
def main(verbose: bool) -> None:
    """Find the fastest way to train a GPT-2-class model on this machine, within a memory
    limit, and hand it back as a recipe."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


def run_options(command: Callable) -> Callable:
    """Options shared by every command that runs the model: what to run and on what."""
    options = [
        click.option("--model", default="gpt2-tiny", show_default=True,
                     help="gpt2, gpt2-medium, gpt2-large, gpt2-xl, gpt2-tiny, or package.module:factory."),
        click.option("--device", default="auto", show_default=True, help="auto (CUDA when present), cpu, cuda or cuda:N."),
        click.option("--data", default="synthetic", show_default=True,
                     help="synthetic, or a PATH.bin (uint16 tokens), PATH.txt or PATH.jsonl file."),
        click.option("--seq-len", type=int, default=None, help="Context length (default: the model's)."),
        click.option("--warmup", type=int, default=3, show_default=True, help="Warm-up steps (compile happens here)."),
        click.option("--steps", type=int, default=20, show_default=True, help="Timed steps."),
        click.option("--seed", type=int, default=0, show_default=True, help="Seed for weights and data."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _run_spec(model: str, device: str, data: str, seq_len: int | None, warmup: int, steps: int, seed: int,
              memory_limit: int | None = None):
    from autotune.config import RunSpec
    from autotune.device import resolve_device
    from autotune.models import check_model_name

    check_model_name(model)
    return RunSpec(model=model, device=resolve_device(device), data=data, seq_len=seq_len, warmup=warmup,
                   steps=steps, seed=seed, memory_limit_bytes=memory_limit)


@main.command(context_settings=CONTEXT_SETTINGS)
@run_options
@click.option("--batching", type=click.Choice(["fixed", "padded", "packed"]), default=None,
              help="Batching mode (same as --set batching=...).")
@click.option("--set", "assignments", multiple=True, metavar="KNOB=VALUE",
              help="Set a knob, e.g. --set amp_dtype=bfloat16 (repeatable).")
@click.option("--memory-limit", default=None, help="Flag the run over_memory_limit above this peak, e.g. 60GiB.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@handle_errors
def bench(model, device, data, seq_len, warmup, steps, seed, batching, assignments, memory_limit, as_json) -> None:
    """Measure one configuration: effective tokens/s, memory, MFU and their spread.

    Knobs: num_workers, prefetch_factor, pin_memory, persistent_workers, token_budget,
    batching, amp_dtype, compile_mode, sdpa_backend, checkpoint_layers.
    """
    from autotune.config import TrainConfig, parse_assignments, parse_memory_size
    from autotune.measure import measure
    from autotune.render import format_measurement

    overrides = parse_assignments(assignments)
    if batching:
        overrides["batching"] = batching
    limit = parse_memory_size(memory_limit) if memory_limit else None
    spec = _run_spec(model, device, data, seq_len, warmup, steps, seed, limit)
    result = measure(spec, TrainConfig().with_overrides(overrides))
    if as_json:
        emit_json(result.to_dict())
    else:
        click.echo(format_measurement(result))
    sys.exit(0 if result.outcome == "ok" else 1)
