"""Quantities people type and read: memory sizes, durations and fractions. Parsed here,
once, for the command line (its ParamTypes), search spaces and recipes alike; `format_bytes`
is here too because outcome reasons at the bottom of the package need it."""

from __future__ import annotations

import math
import re

from autotune.errors import UsageError

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1024**3,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": 1024**4,
}
_DURATION_UNITS = {"": 1, "ms": 0.001, "s": 1, "m": 60, "h": 3600}
# The smallest memory limit that means anything (no model trains in less) and the largest
# any machine has: outside them a value is a typo (0.5 bytes, 1e400) or an overflow.
MIN_MEMORY_SIZE = 1 << 20  # 1 MiB
MAX_MEMORY_SIZE = 1 << 60  # 1 EiB
MAX_DURATION_S = 366 * 24 * 3600.0  # a year


def parse_memory_size(text: str, *, option: str = "--memory-limit") -> int:
    """ "60GiB", "512MiB", "1.5GB", "8000000000" -> bytes. Binary units (GiB) are 1024-based.
    A size must lie between 1 MiB and 1 EiB: anything else is a typo, not a memory limit."""
    match = re.fullmatch(r"\s*(-?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-z]*)\s*", str(text))
    unit = match.group(2).lower() if match else None
    if not match or unit not in _SIZE_UNITS:
        raise UsageError(
            f"{option}: cannot read {shown(text)} as a memory size; expected e.g. 60GiB, 512MiB or 8000000000"
        )
    value = float(match.group(1)) * _SIZE_UNITS[unit]
    if value <= 0:
        raise UsageError(f"{option}: the memory size must be positive, got {shown(text)}")
    if not math.isfinite(value) or value > MAX_MEMORY_SIZE:
        raise UsageError(f"{option}: {shown(text)} is more memory than any machine has (at most 1 EiB)")
    if value < MIN_MEMORY_SIZE:
        hint = f" (a unit is missing: {match.group(1)}GiB?)" if not unit else ""
        raise UsageError(
            f"{option}: {shown(text)} is {format_bytes(int(value))}; a memory limit must be at least 1 MiB{hint}"
        )
    return int(value)


def parse_duration(text: str, *, option: str) -> float:
    """ "90", "90s", "10m", "2h", "40ms" -> seconds."""
    raw = str(text).strip().lower()
    number, unit = raw.rstrip("smh"), raw[len(raw.rstrip("smh")) :]
    # Digits, a point and an exponent only: float() would also take "nan", "inf" and "1_0".
    if not re.fullmatch(r"\s*[-+]?[0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?\s*", number) or unit not in _DURATION_UNITS:
        raise UsageError(f"{option}: cannot read {shown(text)} as a duration; expected e.g. 90s, 10m or 2h") from None
    value = float(number) * _DURATION_UNITS[unit]
    if value <= 0:
        raise UsageError(f"{option}: the duration must be positive, got {shown(text)}")
    if not value <= MAX_DURATION_S:
        raise UsageError(f"{option}: {shown(text)} is longer than a year; give at most 8784h")
    return value


def parse_fraction(text: str, *, option: str) -> float:
    """ "5%" or "0.05" -> 0.05; a fraction in [0, 1)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(%?)\s*", str(text))
    if not match:
        raise UsageError(f"{option}: cannot read {shown(text)}; expected a fraction like 0.05 or a percentage like 5%")
    value = float(match.group(1)) / (100 if match.group(2) else 1)
    if not 0 <= value < 1:
        raise UsageError(f"{option}: {shown(text)} is not between 0 and 100%")
    return value


def check_memory_fraction(value: float, *, option: str = "--memory-fraction") -> float:
    """A share of a device's memory: in (0, 1]. (The limit it gives is checked in bytes too.)"""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise UsageError(f"{option} must be in (0, 1], got {value}")
    return float(value)


def shown(text: object) -> str:
    """A value as an error message quotes it: repr, cut short (an option can be megabytes)."""
    quoted = repr(str(text))
    return quoted if len(quoted) <= 60 else quoted[:57] + "..."


def format_bytes(n: int | float | None) -> str:
    """1536 -> "1.50 KiB"; None -> "n/a"."""
    if n is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n} B"
