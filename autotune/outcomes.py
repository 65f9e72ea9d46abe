"""Trial outcomes, decided in one place.

    ok                  measured, within the memory limit
    over_memory_limit   measured, but its peak memory is above the limit (infeasible)
    oom                 ran out of memory (allocator error, MemoryError or the OOM killer)
    unsupported         this device cannot run the configuration (never retried)
    timeout             killed, with its whole process group, at the trial timeout
    crashed             died (signal, fatal error) or raised something unexpected
    interrupted         stopped by the user (Ctrl-C)
"""

from __future__ import annotations

import signal
import traceback

import torch

from autotune.errors import UnsupportedConfig
from autotune.knobs import is_sdpa_unsupported_error

OK = "ok"
OVER_MEMORY_LIMIT = "over_memory_limit"
OOM = "oom"
UNSUPPORTED = "unsupported"
TIMEOUT = "timeout"
CRASHED = "crashed"
INTERRUPTED = "interrupted"

OUTCOMES = (OK, OVER_MEMORY_LIMIT, OOM, UNSUPPORTED, TIMEOUT, CRASHED, INTERRUPTED)
# Outcomes that measured a throughput the sampler can learn from.
MEASURED = (OK, OVER_MEMORY_LIMIT)
# Outcomes that say "this region does not fit": recorded as infeasible, not as failures.
INFEASIBLE = (OVER_MEMORY_LIMIT, OOM)


def classify_exception(exc: BaseException) -> tuple[str, str]:
    """(outcome, one-line reason) for an exception raised by a measurement."""
    if isinstance(exc, UnsupportedConfig):
        return UNSUPPORTED, str(exc)
    if is_sdpa_unsupported_error(exc):
        return UNSUPPORTED, "sdpa_backend: the forced attention backend cannot run these inputs (" + _first_line(exc) + ")"
    if _is_oom(exc):
        return OOM, "out of memory: " + _first_line(exc)
    return CRASHED, f"{type(exc).__name__}: {_first_line(exc)}\n{_tail(traceback.format_exception(exc))}"


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, (MemoryError, torch.OutOfMemoryError)) or (
        isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()
    )


def classify_exit(returncode: int, stderr_tail: str) -> tuple[str, str]:
    """(outcome, reason) for a trial process that exited without writing a result."""
    if returncode < 0:
        sig = signal.Signals(-returncode).name if -returncode in signal.Signals._value2member_map_ else str(-returncode)
        if -returncode == signal.SIGKILL:
            # Nobody else sends SIGKILL to a trial: the kernel's OOM killer is the usual sender.
            return OOM, f"killed by SIGKILL (most likely the kernel's out-of-memory killer)\n{stderr_tail}".rstrip()
        return CRASHED, f"killed by {sig}\n{stderr_tail}".rstrip()
    return CRASHED, f"exited with status {returncode}\n{stderr_tail}".rstrip()


def decide_measured(peak_memory_bytes: int | None, memory_limit_bytes: int | None) -> tuple[str, str | None]:
    """A run that finished is ok unless its peak memory breaks the limit."""
    if memory_limit_bytes is not None and peak_memory_bytes is not None and peak_memory_bytes > memory_limit_bytes:
        return OVER_MEMORY_LIMIT, (
            f"peak memory {format_bytes(peak_memory_bytes)} is above the limit {format_bytes(memory_limit_bytes)}"
        )
    return OK, None


def format_bytes(n: int | float | None) -> str:
    if n is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n} B"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def _tail(lines: list[str], n: int = 12) -> str:
    return "\n".join("".join(lines).rstrip().splitlines()[-n:])
