"""The exceptions and warnings autotune raises; the CLI turns each error into one line and an
exit code."""

from __future__ import annotations

import unicodedata

# Control characters (C0, DEL, C1), format characters (right-to-left and other bidirectional
# marks, zero-width characters, a byte-order mark) and line and paragraph separators: printed raw,
# they move the cursor, clear the screen, reorder what follows or start a new line.
_INVISIBLE = ("Cc", "Cf", "Zl", "Zp")


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


class DiskFull(AutotuneError):
    """A write refused for want of room: the disk is full (ENOSPC) or the user's quota on it is
    used up (EDQUOT). `path`: where, when known. Nothing that writes there can run until there
    is room (exit 1)."""

    def __init__(self, path: str | None, why: str) -> None:
        where = f": cannot write {path}" if path else ""
        super().__init__(f"no room on the disk{where} ({why})")
        self.path = path


class RecipeEnvironmentWarning(UserWarning):
    """The recipe was measured on other hardware or another torch version."""


class RecipeModelWarning(UserWarning):
    """Applying a recipe changed the model to what the recipe assumes of it (its attention
    through SDPA, no attention dropout under a CPU's flash kernel): said once, when applied."""


def printable(text: object, *, newlines: bool = False) -> str:
    """`text` safe to print on a terminal: every control, format or separator character written
    as its escape (ESC as \\x1b, a right-to-left override as \\u202e, a newline as \\n), so text
    from a user, a file, a study or a model can neither drive the terminal nor forge a line of
    output. `newlines=True` keeps newlines as they are (multi-line output of our own making whose
    fields are escaped already). Letters of every script are kept."""
    text = str(text)
    if text.isprintable():  # the common case, fast
        return text
    return "".join(_escaped(c, newlines) for c in text)


def _escaped(char: str, newlines: bool) -> str:
    if char == "\n" and newlines:
        return char
    if unicodedata.category(char) not in _INVISIBLE:
        return char
    if char in "\n\t\r":
        return {"\n": "\\n", "\t": "\\t", "\r": "\\r"}[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
