"""Process plumbing shared by the trial runner, the trial process and the `--devices` fleet:
process groups, dying with the parent, liveness, stderr tails, reaping a trial's descendants,
and the stop signals (SIGINT, SIGTERM, SIGHUP) handled alike."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import threading
from pathlib import Path
from typing import Callable, Iterable, Iterator

from autotune.device.memory import read_stat
from autotune.measure.outcomes import STOP_SIGNALS

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


def kill_processes(processes: Iterable[tuple[int, int]]) -> list[int]:
    """SIGKILL each (pid, start time) that is still that process (a pid can be reused once its
    process is gone: the start time tells them apart). Returns the pids killed."""
    killed = []
    for pid, start in processes:
        stat = read_stat(pid)
        if stat is None or stat.start_time != start or stat.state == "Z":
            continue
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except (ProcessLookupError, PermissionError):
            pass
    return killed


def processes_with_env(name: str, value: str) -> list[tuple[int, int]]:
    """(pid, start time) of every process of this user whose environment holds name=value.
    A process inherits its parent's environment through fork and exec, whatever session or
    process group it moves to, so a token set on a trial marks all of its descendants."""
    needle = f"{name}={value}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            stat = read_stat(int(entry))
            if stat is not None:
                found.append((stat.pid, stat.start_time))
    return found


# --- stop signals -------------------------------------------------------------------------------


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised in the main thread like the KeyboardInterrupt of a Ctrl-C, so
    every `except KeyboardInterrupt` and `finally` on the way up runs: the trial is killed and
    recorded, the best-so-far recipe written, temporary folders removed."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def stop_signal_of(exc: BaseException) -> int:
    """The signal behind a KeyboardInterrupt (SIGINT for a plain one)."""
    return getattr(exc, "signum", signal.SIGINT)


def exit_code_for(exc: BaseException) -> int:
    """The shell's convention: 128 + the signal (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP)."""
    return 128 + stop_signal_of(exc)


def stop_exception(signum: int) -> KeyboardInterrupt:
    """What a stop signal raises: KeyboardInterrupt for SIGINT, `Stopped` for the others."""
    return KeyboardInterrupt() if signum == signal.SIGINT else Stopped(signum)


def _raise_stopped(signum: int, frame: object) -> None:
    raise Stopped(signum)


@contextlib.contextmanager
def stop_signals_raise() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise `Stopped` (a KeyboardInterrupt) in the main
    thread, as SIGINT raises KeyboardInterrupt. Outside the main thread it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    # A signal set to be ignored (nohup ignores SIGHUP) stays ignored.
    previous = {
        sig: signal.signal(sig, _raise_stopped)
        for sig in STOP_SIGNALS
        if sig != signal.SIGINT and signal.getsignal(sig) is not signal.SIG_IGN
    }
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def stop_signals_recorded() -> Iterator[list[int]]:
    """Within the block a stop signal (SIGINT, SIGTERM, SIGHUP) is only recorded in the yielded
    list, never raised: the block checks the list where it chooses. A KeyboardInterrupt raised
    at an arbitrary bytecode can land inside `Popen.poll()` between taking and releasing its
    wait lock, and that Popen then never reports its child's exit: a supervisor polling it would
    wait forever. Outside the main thread it records nothing."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    previous = {
        sig: signal.signal(sig, lambda signum, frame: received.append(signum))
        for sig in STOP_SIGNALS
        if signal.getsignal(sig) is not signal.SIG_IGN
    }
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def stops_not_swallowed() -> Iterator[None]:
    """Within the block a stop signal raises as usual (KeyboardInterrupt, or `Stopped`) and is
    remembered: if code inside swallows it and returns (bottle's server, which optuna-dashboard
    runs, catches KeyboardInterrupt and returns normally), it is raised again after the block,
    so the command still ends with 128 + the signal. Outside the main thread it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def stop(signum: int, frame: object) -> None:
        received.append(signum)
        raise stop_exception(signum)

    previous = {sig: signal.signal(sig, stop) for sig in STOP_SIGNALS if signal.getsignal(sig) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if received:
        raise stop_exception(received[0])


@contextlib.contextmanager
def stops_deferred() -> Iterator[None]:
    """Hold a stop signal that arrives inside the block until the block is done, then raise it:
    what the block writes (a study and its set-up, a trial's clean-up) is never left half
    done. A second signal inside the block raises at once (the user insists)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []

    def hold(signum: int, frame: object) -> None:
        if pending:
            raise stop_exception(signum)
        pending.append(signum)

    previous = {sig: signal.signal(sig, hold) for sig in STOP_SIGNALS if signal.getsignal(sig) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if pending:  # delivered now, to whatever handled it before the block
        handler = previous[pending[0]]
        if callable(handler):
            handler(pending[0], None)
        else:
            signal.raise_signal(pending[0])
