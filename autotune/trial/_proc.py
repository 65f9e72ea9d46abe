"""Process plumbing shared by the trial runner, the trial process and the `--devices` fleet:
process groups, dying with the parent, liveness, stderr tails."""

from __future__ import annotations

import ctypes
import os
import signal
from pathlib import Path
from typing import Callable

_PR_SET_PDEATHSIG = 1


def _prctl() -> Callable[..., int] | None:
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: process-group kills still apply there
        return None


def die_with_parent(parent_pid: int, sig: int = signal.SIGKILL) -> None:
    """Have the kernel send `sig` to this process when its parent dies (PR_SET_PDEATHSIG);
    exit at once if the parent is already gone. Safe between fork and exec: C calls only
    once the prctl function has been looked up, which `death_signal_setter` does beforehand."""
    death_signal_setter(parent_pid, sig)()


def death_signal_setter(parent_pid: int, sig: int = signal.SIGKILL) -> Callable[[], None]:
    """A function for `Popen(preexec_fn=...)`: it runs in the child between fork and exec,
    where only async-signal-safe work may happen, so the libc lookup is done here, first."""
    prctl = _prctl()

    def set_death_signal() -> None:
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, sig)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    return set_death_signal


def kill_group(pid: int) -> None:
    """SIGKILL the whole process group led by `pid` (a trial and everything it started)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stderr_tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])
