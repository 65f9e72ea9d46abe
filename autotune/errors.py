"""The exceptions and warnings autotune raises; the CLI turns each error into one line and an
exit code."""

from __future__ import annotations


class AutotuneError(Exception):
    """Base class: a problem the user can fix, stated in one line."""

    exit_code = 1


class UsageError(AutotuneError):
    """Bad input: an option, a file or a value that cannot be used as given (exit 2)."""

    exit_code = 2


class UnsupportedConfig(AutotuneError):
    """A configuration this device cannot run (e.g. flash attention with float32 on CUDA)."""

    def __init__(self, knob: str, reason: str) -> None:
        super().__init__(f"{knob}: {reason}")
        self.knob = knob
        self.reason = reason


class RecipeEnvironmentWarning(UserWarning):
    """The recipe was measured on other hardware or another torch version."""
