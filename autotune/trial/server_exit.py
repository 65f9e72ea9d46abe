"""What the fork server does when its tuner is gone: it kills everything it started, then ends.

The fork server (`trial.fork_server`) imports this module first of its preloads, and nothing
else imports it. It learns of its tuner's death, SIGKILL included, two ways:

  - PR_SET_PDEATHSIG: the kernel sends it SIGTERM when the tuner (the thread of it that started
    the server) dies; set before the seconds of importing torch;
  - the end of its "alive" pipe, multiprocessing's own rule: the server's loop ends when every
    holder of the pipe's write end is gone. The tuner holds one, and each forked trial closes its
    copy at once (`fork_server._child`), but one held stopped, or not yet there, still has it.

Either way the server kills, with SIGKILL:

  - each trial's process group (a trial leads its own session: DataLoader workers, compile
    workers and whatever else stayed in it), and each process below the server;
  - every process carrying the tuner's token (TOKEN_ENV), as the runner's reaping does: a
    process that left the trial's group (setsid, a double fork) carries it all the same;

then runs the other exit hooks and ends (os._exit): it has nothing else to save, and an
interpreter's teardown with torch loaded takes seconds. The trials would die anyway with the
server (their PR_SET_PDEATHSIG names it, their parent), but their groups would not: on a GPU an
orphaned DataLoader worker or a user's helper process holds on while the user reruns the
command. The hooks act only in the server, never in a trial forked from it: a trial resets
SIGTERM as it starts, ends with os._exit (which runs no exit hook), and has another pid."""

from __future__ import annotations

import atexit
import os
import signal

from autotune import environment
from autotune.device import descendants
from autotune.device.memory import read_stat
from autotune.trial.processes import die_with_parent, kill_group, kill_processes, processes_with_env

TOKEN_ENV = environment.TRIAL_TOKEN


def kill_what_the_server_started(server_pid: int, token: str) -> None:
    """Kill every trial of the server `server_pid` with its group, everything below the
    server, and every process carrying `token` (but the server itself)."""
    below = [stat for stat in map(read_stat, descendants(server_pid)) if stat is not None]
    for stat in below:
        if stat.ppid == server_pid:  # a trial: the leader of its own process group
            kill_group(stat.pid)
    kill_processes((stat.pid, stat.start_time) for stat in below)
    kill_processes(processes_with_env(TOKEN_ENV, token))


_exiting: list[bool] = []  # set once the server's exit has begun: the hooks below run once


def _on_exit(server_pid: int, token: str) -> None:
    """The server's exit, from its exit hook or its PDEATHSIG: kill what it started, run the
    other exit hooks, and end without the interpreter's teardown (seconds with torch loaded)."""
    if os.getpid() != server_pid or _exiting:  # a process forked from the server; or a second call
        return
    _exiting.append(True)
    kill_what_the_server_started(server_pid, token)
    atexit._run_exitfuncs()  # the others (ours, called again, returns at once): what they write is kept
    os._exit(0)


def _install() -> None:
    token = os.environ.get(TOKEN_ENV)
    if not token:  # a fork server starts with its tuner's token in its environment; a tuner never has it
        return
    server = os.getpid()
    atexit.register(_on_exit, server, token)
    signal.signal(signal.SIGTERM, lambda signum, frame: _on_exit(server, token))
    die_with_parent(os.getppid(), signal.SIGTERM)


_install()
