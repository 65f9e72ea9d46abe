"""What the commands share: options made from their one declaration (`search.settings`: the
options of every command that runs the model are `search`'s), the ParamTypes that read numbers,
memory sizes, durations and fractions, and JSON output."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import re
import sys
from typing import Any, Callable, Iterator

import click

from autotune import units
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

study_options = _stack(
    click.option("--study", default=None, help="Study name."),
    click.option("--storage", default=None, help="Optuna storage URL or a .db / .journal path."),
)
"""Which stored study: show, export, report, dashboard."""


def settings_options(settings_cls: Any, *names: str, **changes: dict[str, Any]) -> Callable[[Callable], Callable]:
    """The click options of a settings dataclass's fields (`search.settings.SearchSettings`), each
    made from the `Option` in its metadata: every field in declaration order, or the fields
    named, in that order (`bench`, `verify`, `profile` and `doctor` take those they share with
    `search`). `changes[name]`, a named override, replaces `default` or `Option` fields of that
    one (profile's `--steps` counts profiled steps from 1). The command receives them by field
    name (`settings_cls.from_options(values)`)."""
    declared = {name: (option, default) for name, option, default in settings_cls.options()}
    picked = [(name, *declared[name], changes.get(name, {})) for name in names or declared]
    return _stack(*(_click_option(*option) for option in picked))


def _click_option(name: str, option: Any, default: Any, change: dict[str, Any]) -> Callable:
    default = change.get("default", default)
    option = dataclasses.replace(option, **{field: value for field, value in change.items() if field != "default"})
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
