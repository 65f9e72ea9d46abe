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


def stop_behind(exc: BaseException) -> KeyboardInterrupt | None:
    """The stop (a KeyboardInterrupt) that `exc` is, or was raised while handling; None if none."""
    seen: list[BaseException] = []
    link: BaseException | None = exc
    while link is not None and all(link is not s for s in seen):
        if isinstance(link, KeyboardInterrupt):
            return link
        seen.append(link)
        link = link.__context__
    return None


def stop_exception(signum: int) -> KeyboardInterrupt:
    """What a stop signal raises: KeyboardInterrupt for SIGINT, `Stopped` for the others."""
    return KeyboardInterrupt() if signum == signal.SIGINT else Stopped(signum)


class _StopState:
    """Where this process stands with stop signals (they are the process's, handled in its main
    thread): how many `stop_signals_raise` blocks are open, and the signal of the stop under way
    once one has raised in them."""

    blocks = 0
    under_way: int | None = None


def stop_under_way() -> int | None:
    """The signal of the stop under way (one has raised, and the orderly stop it started goes
    on), or None."""
    return _StopState.under_way


def begin_stop(signum: int) -> None:
    """Raise the stop for `signum` (KeyboardInterrupt, or `Stopped`): the first one. Inside
    `stop_signals_raise`, once one has raised, a stop is under way and later ones return here
    without raising (absorbed)."""
    if _StopState.blocks:
        if _StopState.under_way is not None:
            return
        _StopState.under_way = signum
    raise stop_exception(signum)


def _stop_handler(signum: int, frame: object) -> None:
    begin_stop(signum)


def _ours_to_handle(handler: object) -> bool:
    """A stop signal's handler that `stop_signals_raise` takes over: Python's own (SIGINT's
    KeyboardInterrupt, the default action) or ours; never one set to be ignored (nohup ignores
    SIGHUP) nor a library caller's own."""
    return handler in (signal.default_int_handler, signal.SIG_DFL, _stop_handler)


@contextlib.contextmanager
def stop_signals_raise(*, then_ignored: bool = False) -> Iterator[None]:
    """Within the block a stop signal raises in the main thread: KeyboardInterrupt for SIGINT,
    `Stopped` (a KeyboardInterrupt) for SIGTERM and SIGHUP, so every `except KeyboardInterrupt`
    and `finally` on the way up runs. The first one only: it starts an orderly stop (the trial
    killed and recorded, the best-so-far recipe written), and the ones after it are absorbed
    until the outermost block ends. A user pressing Ctrl-C again and again while the tuner
    stops must not cut that short: a second KeyboardInterrupt inside Optuna's recording of the
    trial left it RUNNING, and no recipe was written.

    `then_ignored`: the block is the last work of the process (the command line's). After a
    stop, stop signals stay ignored until it has exited: Python restores SIGINT's default
    action as it shuts down, and a later press killed it by SIGINT, or raised into its exit
    hooks. Outside the main thread it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    taken = [sig for sig in STOP_SIGNALS if _ours_to_handle(signal.getsignal(sig))]
    previous = {sig: signal.signal(sig, _stop_handler) for sig in taken}
    _StopState.blocks += 1
    try:
        yield
    finally:
        _StopState.blocks -= 1
        stopped = _StopState.under_way is not None
        if not _StopState.blocks:
            _StopState.under_way = None
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_IGN if then_ignored and stopped else handler)


@contextlib.contextmanager
def stop_signals_recorded() -> Iterator[list[int]]:
    """Within the block a stop signal (SIGINT, SIGTERM, SIGHUP) is only recorded in the yielded
    list, never raised: the block checks the list where it chooses. A KeyboardInterrupt raised
    at an arbitrary bytecode can land inside `Popen.poll()` between taking and releasing its
    wait lock, and that Popen then never reports its child's exit: a supervisor polling it would
    wait forever. A signal while a stop is under way is not recorded (`stop_signals_raise`).
    Outside the main thread it records nothing."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def record(signum: int, frame: object) -> None:
        if stop_under_way() is None:  # else absorbed: see stop_signals_raise
            received.append(signum)

    previous = {sig: signal.signal(sig, record) for sig in STOP_SIGNALS if signal.getsignal(sig) is not signal.SIG_IGN}
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
        begin_stop(signum)

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
    done. Later signals inside the block are absorbed, as are all of them while a stop is
    already under way (`stop_signals_raise`): pressing Ctrl-C again must not cut short the
    work the first press waits on."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []

    def hold(signum: int, frame: object) -> None:
        if not pending and stop_under_way() is None:
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
