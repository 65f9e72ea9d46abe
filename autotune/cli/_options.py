"""What the commands share: options defined once (as decorators), the ParamTypes that read
memory sizes, durations and fractions, and JSON output."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import sys
from typing import Any, Callable, Iterator

import click

from autotune import units
from autotune.config import MAX_GLOBAL_BATCH_TOKENS, MAX_MIN_TIME_S, MAX_SEED, MAX_SEQ_LEN, MAX_STEPS
from autotune.errors import UsageError, printable

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


class Number(click.ParamType):
    """A whole number (`integer=True`) or a finite number within [low, high] (above low when
    `above_low`). Anything else raises UsageError, which the `autotune` group prints as one line
    naming the option and the range, exit 2: "--steps: expected a whole number from 2 to
    1000000, got '-3'". Digits are read only up to 40 of them: int() of thousands of digits is
    slow, and Python refuses it past 4300."""

    def __init__(self, low: float, high: float, *, integer: bool = True, above_low: bool = False) -> None:
        self.name = "integer" if integer else "number"
        self.low, self.high, self.integer, self.above_low = low, high, integer, above_low

    def expected(self) -> str:
        what = "a whole number" if self.integer else "a number"
        low = f"above {_plain(self.low)} and at most" if self.above_low else f"from {_plain(self.low)} to"
        return f"{what} {low} {_plain(self.high)}"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        option = param.opts[0] if param is not None and param.opts else self.name
        if isinstance(value, (int, float)) and not isinstance(value, bool):  # a default
            number: float | None = value
        else:
            number = _number(str(value), integer=self.integer)
        in_range = number is not None and math.isfinite(number) and self.low <= number <= self.high
        if not in_range or (self.above_low and number == self.low):
            raise UsageError(f"{option}: expected {self.expected()}, got {units.shown(value)}")
        return number


def _plain(bound: float) -> str:
    """1000000, not 1e+06; 0.5 as it is."""
    return str(int(bound)) if float(bound).is_integer() else f"{bound:g}"


def _number(text: str, *, integer: bool) -> float | None:
    text = text.strip()
    pattern = (
        r"[+-]?[0-9]{1,40}" if integer else r"[+-]?(?:[0-9]{1,40}\.?[0-9]{0,40}|\.[0-9]{1,40})(?:[eE][+-]?[0-9]{1,4})?"
    )
    if not re.fullmatch(pattern, text):
        return None
    return int(text) if integer else float(text)


STEPS = Number(2, MAX_STEPS)  # a timed window needs two steps (a median, a spread)
PROFILED_STEPS = Number(1, MAX_STEPS)
WARMUP = Number(0, MAX_STEPS)
MIN_TIME = Number(0, MAX_MIN_TIME_S, integer=False)
SEQ_LEN = Number(2, MAX_SEQ_LEN)
SEED = Number(0, MAX_SEED)  # what numpy's and torch's generators take
GLOBAL_BATCH_TOKENS = Number(1, MAX_GLOBAL_BATCH_TOKENS)
LIST_LIMIT = Number(1, 1_000_000)
PORT = Number(1, 65535)

MEMORY_SIZE = _UnitType("size", units.parse_memory_size)
DURATION = _UnitType("duration", units.parse_duration)
FRACTION = _UnitType("fraction", units.parse_fraction)


def say(text: str, *, err: bool = False) -> None:
    """Print text of our making for people: its lines as they are, any terminal control in it
    (from a field a presenter did not escape) escaped (see `errors.printable`)."""
    click.echo(printable(text, newlines=True), err=err)


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


@contextlib.contextmanager
def stdout_to_stderr(enabled: bool = True) -> Iterator[None]:
    """While measuring in this process for --json, whatever the model prints goes to stderr, so
    stdout holds the JSON alone: Python's prints (sys.stdout), and C code's and DataLoader
    workers' (file descriptor 1, pointed at stderr's file meanwhile)."""
    if not enabled:
        yield
        return
    sys.stdout.flush()
    try:
        saved = os.dup(1)
        os.dup2(2, 1)
    except OSError:  # no descriptor 1 or 2 (a daemon): Python's prints are redirected all the same
        saved = None
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stderr.flush()
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)


def _stack(*options: Callable) -> Callable[[Callable], Callable]:
    def apply(command: Callable) -> Callable:
        for option in reversed(options):
            command = option(command)
        return command

    return apply


def _verbose(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    """-v: autotune's INFO lines are logged while the command runs (the root logger at INFO),
    whether -v comes before the command or after it; the level is set back when it ends."""
    if value:
        root = logging.getLogger()
        ctx.call_on_close(lambda level=root.level: root.setLevel(level))
        root.setLevel(min(root.getEffectiveLevel(), logging.INFO))
    return value


# The group's and every command's -v (the group adds it to each command it holds), so that
# `autotune -v search` and `autotune search -v` are the same.
verbose_option = click.option(
    "-v",
    "--verbose",
    is_flag=True,
    expose_value=False,
    callback=_verbose,
    help="Log what autotune decides (tokenizer, NVML, ...).",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
device_option = click.option(
    "--device", default="auto", show_default=True, help="auto (CUDA when present), cpu, cuda or cuda:N."
)
warmup_option = click.option(
    "--warmup", type=WARMUP, default=3, show_default=True, help="Warm-up steps (compile happens here)."
)
steps_option = click.option("--steps", type=STEPS, default=20, show_default=True, help="Timed steps, at least.")
min_time_option = click.option(
    "--min-time",
    type=MIN_TIME,
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
    type=GLOBAL_BATCH_TOKENS,
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
    click.option("--seq-len", type=SEQ_LEN, default=None, help="Context length (default: the model's)."),
    warmup_option,
    steps_option,
    min_time_option,
    click.option("--seed", type=SEED, default=0, show_default=True, help="Seed for weights and data."),
)
"""What to run and on what: every command that runs the model."""

study_options = _stack(
    click.option("--study", default=None, help="Study name."),
    click.option("--storage", default=None, help="Optuna storage URL or a .db / .journal path."),
)
"""Which stored study: show, export, report, dashboard."""


def settings_subset(settings_cls: Any, names: tuple[str, ...]) -> Callable[[Callable], Callable]:
    """The click options of some fields of a settings dataclass, declared there once (`bench`
    takes the generation workload's options of `search`)."""
    return _stack(*(_click_option(n, option, default) for n, option, default in settings_cls.options() if n in names))


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
        "int": Number(option.minimum, option.maximum),
        "float": Number(option.minimum, option.maximum, integer=False, above_low=option.above_minimum),
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
