"""The AUTOTUNE_* environment variables, each declared once here with its rule, and read
through here (`value`). `check_environment` validates every one that is set, at the start of
each command (the CLI's group calls it): a bad value is one line naming the variable and what
it takes, exit 2, before anything runs, never a failure later in a thread (a huge
AUTOTUNE_HEARTBEAT_S overflowed `Event.wait` in Optuna's heartbeat thread, which died, and
heartbeats silently stopped)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from autotune import registry
from autotune.errors import UsageError
from autotune.units import shown

HEARTBEAT_S = "AUTOTUNE_HEARTBEAT_S"
LOCK_WAIT_S = "AUTOTUNE_LOCK_WAIT_S"
MAX_NUM_WORKERS = "AUTOTUNE_MAX_NUM_WORKERS"
TRIAL_START = "AUTOTUNE_TRIAL_START"
STORAGE = "AUTOTUNE_STORAGE"
TRIAL_TOKEN = "AUTOTUNE_TRIAL_TOKEN"

MAX_HEARTBEAT_S = 24 * 3600  # a beat a day already lets a dead worker's trial wait four days
MAX_LOCK_WAIT_S = 24 * 3600
MAX_STORAGE_CHARS = 4096


@dataclass(frozen=True)
class Variable:
    """One variable: what it takes (`expected`, for the error), how its text is read (`parse`:
    None when the text is not acceptable), and its value when unset or empty."""

    name: str
    expected: str
    parse: Callable[[str], Any]
    default: Any = None


def _whole(low: int, high: int) -> Callable[[str], int | None]:
    def parse(text: str) -> int | None:
        if not re.fullmatch(r"\+?[0-9]{1,20}", text):
            return None
        value = int(text)
        return value if low <= value <= high else None

    return parse


def _one_of(*choices: str) -> Callable[[str], str | None]:
    return lambda text: text if text in choices else None


def _storage(text: str) -> str | None:
    # What the URL means is checked where --storage is; here only that it is one line of text.
    return text if len(text) <= MAX_STORAGE_CHARS and text.isprintable() else None


VARIABLES: dict[str, Variable] = {
    v.name: v
    for v in (
        Variable(
            HEARTBEAT_S,
            f"a whole number of seconds from 1 to {MAX_HEARTBEAT_S}",
            _whole(1, MAX_HEARTBEAT_S),
            default=30,
        ),
        Variable(
            LOCK_WAIT_S,
            f"a whole number of seconds from 0 to {MAX_LOCK_WAIT_S}",
            _whole(0, MAX_LOCK_WAIT_S),
            default=120,  # a backup or a short transaction passes; a forgotten open transaction does not
        ),
        Variable(
            MAX_NUM_WORKERS,
            f"a whole number from 0 to {registry.MAX_NUM_WORKERS}",
            _whole(0, registry.MAX_NUM_WORKERS),
        ),
        Variable(TRIAL_START, "fork or exec", _one_of("fork", "exec"), default="fork"),
        Variable(STORAGE, f"a storage URL on one line, at most {MAX_STORAGE_CHARS} characters", _storage),
        # Set by autotune itself for its trial processes (see trial.fork_server).
        Variable(TRIAL_TOKEN, "a hexadecimal token", lambda t: t if re.fullmatch(r"[0-9a-f]{1,64}", t) else None),
    )
}


def value(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """The variable's value (its default when unset or blank); UsageError when it is not valid."""
    variable = VARIABLES[name]
    raw = (os.environ if environ is None else environ).get(name)
    if raw is None or raw.strip() == "":
        return variable.default
    parsed = variable.parse(raw.strip())
    if parsed is None:
        raise UsageError(f"{name}: expected {variable.expected}, got {shown(raw)}; fix or unset it")
    return parsed


def is_set(name: str, environ: Mapping[str, str] | None = None) -> bool:
    return bool((os.environ if environ is None else environ).get(name, "").strip())


def check_environment(environ: Mapping[str, str] | None = None) -> None:
    """Every AUTOTUNE_* variable autotune reads, validated (UsageError for the first bad one)."""
    for name in VARIABLES:
        value(name, environ)
