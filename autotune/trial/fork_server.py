"""Trial processes forked from a server that has imported torch once.

A trial needs a process of its own (see `trial.__main__`), but a fresh interpreter pays for
importing torch every time: 2-5 s of CPU per trial on a small machine, often more than the
measurement of a small configuration. So a tuner starts trials from multiprocessing's fork
server, started once with torch imported and CUDA never initialized (forking it is safe; each
trial starts CUDA, compiles and loads data in its own address space, as a fresh process would).

Each child becomes what `python -m autotune.trial` would be: its own session (its group is
killed whole), stdout and stderr to the trial's file, the environment and working directory
the runner gives it (the working directory first on sys.path, as `-m` puts it), the platform's
default multiprocessing start method (a DataLoader's workers fork from the trial), and death
with its parent, the server.

The server exits when the tuner does, however it dies (kill -9 included): multiprocessing ends
the server when the last holder of the write end of its "alive" pipe is gone, and it hands a
copy to every process it forks, for that process to start processes of its own from the server.
A trial never does, so it closes its copy at once: otherwise a trial kept its own server alive,
and with it itself (its PR_SET_PDEATHSIG names the server), running on for its whole measurement
after its tuner was killed. On the way out the server kills its trials' process groups and every
process carrying the tuner's token; it also gets PR_SET_PDEATHSIG from the tuner, for a trial
that still holds its copy (not yet started, or held stopped): see `trial.server_exit`.

The server starts with this tuner's token in its environment (TOKEN_ENV). A forked process
shows the environment of its last exec'd ancestor in /proc/PID/environ, so the token marks
every trial and everything a trial forks or execs, whatever session it moves to; a tuner runs
one trial at a time, so when a trial ends every process carrying the token, but the tuner's own
children (the server, and multiprocessing's resource tracker), is left over from it
(`runner._reap`).

AUTOTUNE_TRIAL_START=exec starts each trial as a fresh interpreter instead (the old way, for a
platform without fork)."""

from __future__ import annotations

import contextlib
import importlib.machinery
import logging
import multiprocessing
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
import secrets
import signal
import sys
import tempfile
import threading
import types
from typing import Any, Iterator, Sequence

from autotune import environment

TOKEN_ENV = environment.TRIAL_TOKEN
START_ENV = environment.TRIAL_START  # fork (default) | exec
PRELOAD = ["torch", "torch._dynamo", "autotune.measure.loop"]  # what every trial imports; never CUDA initialization
# Imported first by the server: it dies with the tuner and kills what it started (see there).
SERVER_EXIT = "autotune.trial.server_exit"
# What a trial of a Hugging Face model imports besides: ~10 s of CPU per process on a small
# machine (more than torch), paid once in the server instead of in the probe and every trial.
HF_PRELOAD = ["transformers", "transformers.models.gpt2.modeling_gpt2", "transformers.models.llama.modeling_llama"]

_lock = threading.RLock()
_token: str | None = None
_failed = False
logger = logging.getLogger(__name__)


# The server listens on a Unix socket that multiprocessing names under the temp dir,
# "<dir>/pymp-XXXXXXXX/listener-XXXXXXXX" (tempfile's 8-character names): 32 bytes after the dir,
# and a socket's path stops at 107 bytes. A deeper dir fails at bind ("AF_UNIX path too long").
SOCKET_SUFFIX = len("/pymp-XXXXXXXX/listener-XXXXXXXX")
MAX_SOCKET_DIR = 107 - SOCKET_SUFFIX


def fork_enabled() -> bool:
    """Fork trials, unless asked not to, the platform has no fork server, it failed to start
    in this tuner, or the temp dir is too deep for its socket (a fresh interpreter then)."""
    return (
        environment.value(START_ENV) != "exec"
        and not _failed
        and "forkserver" in multiprocessing.get_all_start_methods()
        and len(tempfile.gettempdir()) <= MAX_SOCKET_DIR
    )


def disable(reason: str) -> None:
    """The server could not start: this tuner's trials start as fresh interpreters, said once."""
    global _failed
    if not _failed:
        logger.warning("trials start as fresh interpreters: the fork server failed (%s)", reason)
    _failed = True


def token() -> str:
    """This tuner's token: in the server's environment, so in every trial's."""
    global _token
    with _lock:
        if _token is None:
            _token = secrets.token_hex(16)
        return _token


class TrialProcess:
    """A trial forked from the server, with the part of Popen's interface the runner uses."""

    def __init__(
        self, argv: list[str], *, env: dict[str, str], cwd: str, output: str, preload: Sequence[str] = ()
    ) -> None:
        context = _context(preload)
        self._process = context.Process(target=_child, args=(argv, env, cwd, output), name="autotune-trial")
        with _lock, _main_module_hidden():
            self._process.start()
        self.pid: int = self._process.pid

    @property
    def returncode(self) -> int | None:
        """As Popen's: the exit status, or -N for a death by signal N; None while it runs."""
        return self._process.exitcode

    def poll(self) -> int | None:
        return self.returncode

    def wait(self) -> int | None:
        self._process.join()
        return self.returncode


def preload_for(model: str | None) -> list[str]:
    """Modules worth importing in the server for trials of `model`, besides PRELOAD."""
    return HF_PRELOAD if model and model.startswith("hf:") else []


def _context(preload: Sequence[str] = ()) -> multiprocessing.context.BaseContext:
    """The fork server, started (or restarted, if it died) with the token in its environment.
    `preload`: modules it imports besides PRELOAD when it starts now (a running server keeps
    what it has; a trial imports the rest itself). A module that fails to import is skipped."""
    context = multiprocessing.get_context("forkserver")
    with _lock:
        # The resource tracker first and outside the token: it is no trial's.
        multiprocessing.resource_tracker.ensure_running()
        context.set_forkserver_preload([SERVER_EXIT, *PRELOAD, *preload])
        with _environment(TOKEN_ENV, token()), _ctrl_c_blocked():
            multiprocessing.forkserver.ensure_running()  # a no-op while it runs
    return context


@contextlib.contextmanager
def _ctrl_c_blocked() -> Iterator[None]:
    """SIGINT blocked in this thread while the server is started, so blocked in the server from
    its first instruction (a signal mask survives fork and exec), as multiprocessing does for
    its resource tracker. A terminal's Ctrl-C reaches the whole foreground process group, the
    server included, and the server ignores SIGINT only once it has imported torch: before, it
    printed a KeyboardInterrupt traceback under the tuner's one line. Blocked, the Ctrl-C waits,
    and is dropped when the server ignores SIGINT; the tuner alone acts on it. A trial unblocks
    it as it starts (`_child`)."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


@contextlib.contextmanager
def _main_module_hidden() -> Iterator[None]:
    """multiprocessing re-imports the parent's main script in every child it starts (so that
    functions defined there unpickle). A trial needs nothing from it, and a user's script that
    calls autotune without an `if __name__ == "__main__":` guard would run again in each trial.
    While a trial starts, __main__ is a stand-in whose name multiprocessing skips (a package's
    __main__ module, as under `python -m`)."""
    real = sys.modules["__main__"]
    stand_in = types.ModuleType("__main__")
    stand_in.__spec__ = importlib.machinery.ModuleSpec("autotune.trial.__main__", None)
    sys.modules["__main__"] = stand_in
    try:
        yield
    finally:
        sys.modules["__main__"] = real


@contextlib.contextmanager
def _environment(name: str, value: str) -> Iterator[None]:
    """`name=value` in this process's environment while the server is exec'd, then as before:
    the tuner's own children (fleet workers, a dashboard) must not carry the token."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def _child(argv: list[str], env: dict[str, Any], cwd: str, output: str) -> None:
    """In the forked trial: become `python -m autotune.trial ARGV`."""
    os.setsid()
    _close_the_servers_alive_pipe()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the server's handler (server_exit) is not a trial's
    # multiprocessing's default context, as a fresh interpreter has it: a forked child inherits
    # the server's (forkserver), and a DataLoader's workers would then come from a second fork
    # server, an interpreter importing torch inside the trial, not forked from it as in a user's
    # `python train.py` (seconds of warm-up and hundreds of MiB the configuration does not cost).
    multiprocessing.set_start_method(None, force=True)
    fd = os.open(output, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    # The server's mask blocks SIGINT (see _ctrl_c_blocked); a trial takes it as any process
    # does, now that what it would print goes to its own file.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.path.insert(0, cwd)
    from autotune.trial.__main__ import main

    code = main([*argv, str(os.getppid())])  # dies with the server, which dies with the tuner
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # as the script does: skip the interpreter's teardown


def _close_the_servers_alive_pipe() -> None:
    """Close this process's copy of the write end of the server's "alive" pipe (see the
    module's docstring): the tuner's must be the last, so that the server ends with the tuner."""
    server = multiprocessing.forkserver._forkserver
    fd = getattr(server, "_forkserver_alive_fd", None)
    if isinstance(fd, int):
        with contextlib.suppress(OSError):
            os.close(fd)
        server._forkserver_alive_fd = None
