"""What the commands share: options defined once (as decorators), the ParamTypes that read
memory sizes, durations and fractions, and JSON output."""

from __future__ import annotations

import json
from typing import Any, Callable

import click

from autotune import units

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class _UnitType(click.ParamType):
    """A click type that reads a value with one of `autotune.units`' parsers. A bad value
    raises the parser's UsageError, which the `autotune` group prints as one line, exit 2."""

    def __init__(self, name: str, parse: Callable[..., Any]) -> None:
        self.name = name
        self._parse = parse

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):  # a default that is already converted
            return value
        option = param.opts[0] if param is not None and param.opts else self.name
        return self._parse(value, option=option)


MEMORY_SIZE = _UnitType("size", units.parse_memory_size)
DURATION = _UnitType("duration", units.parse_duration)
FRACTION = _UnitType("fraction", units.parse_fraction)


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


def _stack(*options: Callable) -> Callable[[Callable], Callable]:
    def apply(command: Callable) -> Callable:
        for option in reversed(options):
            command = option(command)
        return command

    return apply


json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
device_option = click.option(
    "--device", default="auto", show_default=True, help="auto (CUDA when present), cpu, cuda or cuda:N."
)
warmup_option = click.option(
    "--warmup", type=int, default=3, show_default=True, help="Warm-up steps (compile happens here)."
)
steps_option = click.option(
    "--steps", type=int, default=20, show_default=True, help="Timed (or profiled) steps, at least."
)
min_time_option = click.option(
    "--min-time",
    type=float,
    default=2.0,
    show_default=True,
    help="Time the steps for at least this many seconds too (more steps on a fast device).",
)
memory_limit_option = click.option(
    "--memory-limit",
    type=MEMORY_SIZE,
    default=None,
    help="Peak memory a configuration may use, e.g. 60GiB (GPU memory via NVML; peak RSS on CPU).",
)
global_batch_option = click.option(
    "--global-batch-tokens",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Tokens (positions, padding included) per optimizer step, reached by gradient accumulation over "
    "micro-batches of the token budget, which must divide N (default: one micro-batch per step). tokens/s "
    "counts every micro-step.",
)

run_options = _stack(
    click.option(
        "--model",
        default="gpt2-tiny",
        show_default=True,
        help="gpt2, gpt2-medium, gpt2-large, gpt2-xl, gpt2-tiny; a Hugging Face model from its config (random "
        "weights, nothing downloaded): hf:gpt2 ... hf:gpt2-xl, hf:gpt2-tiny, hf:llama-tiny, hf:smollm-135m, or "
        "hf:PATH (a local config directory); or package.module:factory.",
    ),
    device_option,
    click.option(
        "--data",
        default="synthetic",
        show_default=True,
        help="synthetic, or a PATH.bin (uint16 tokens), PATH.txt or PATH.jsonl file.",
    ),
    click.option("--seq-len", type=int, default=None, help="Context length (default: the model's)."),
    warmup_option,
    steps_option,
    min_time_option,
    click.option("--seed", type=int, default=0, show_default=True, help="Seed for weights and data."),
)
"""What to run and on what: every command that runs the model."""

study_options = _stack(
    click.option("--study", default=None, help="Study name."),
    click.option("--storage", default=None, help="Optuna storage URL or a .db / .journal path."),
)
"""Which stored study: show, export, report, dashboard."""


def settings_options(settings_cls: Any) -> Callable[[Callable], Callable]:
    """The click options of every field of a settings dataclass (`search.settings.SearchSettings`),
    each made from the `Option` in its metadata, in declaration order; the command receives them
    by field name (`settings_cls.from_options(values)`)."""
    return _stack(*(_click_option(name, option, default) for name, option, default in settings_cls.options()))


def _click_option(name: str, option: Any, default: Any) -> Callable:
    common = {"help": option.help, "hidden": option.hidden}
    if option.kind == "flag":
        return click.option(option.flag, name, is_flag=True, default=False, **common)
    if option.kind == "off":
        return click.option(option.flag, name, flag_value=False, default=True, **common)
    types = {
        "text": None,
        "int": _AtLeast(option.minimum) if option.minimum is not None else int,
        "float": float,
        "size": MEMORY_SIZE,
        "duration": DURATION,
        "fraction": FRACTION,
        "choice": click.Choice(list(option.choices)),
    }
    return click.option(
        option.flag,
        name,
        type=types[option.kind],
        default=default,
        show_default=option.show_default,
        envvar=option.envvar,
        show_envvar=option.envvar is not None,
        metavar=option.metavar,
        **common,
    )


class _AtLeast(click.ParamType):
    """An integer of at least `minimum`: "Invalid value for '--n-trials': must be at least 1"."""

    name = "integer"

    def __init__(self, minimum: int) -> None:
        self.minimum = minimum

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        else:
            text = str(value).strip()
            if len(text) > 40 or not text.lstrip("+-").isdigit():
                self.fail(f"{text[:40]!r} is not an integer", param, ctx)
            number = int(text)
        if number < self.minimum:
            self.fail(f"must be at least {self.minimum}", param, ctx)
        return number
