"""Each trial's temporary folder (its request, its result, its stderr), and the clean-up of
those a killed tuner left behind.

A tuner removes a trial's folder when the trial ends, but a tuner killed outright (SIGKILL,
the OOM killer) removes nothing. So each folder is named after its tuner, in its PID namespace
(`autotune-trial-<namespace>-<pid>-<random>`), and a search starting later removes the folders
of tuners that are gone. The namespace keeps a tuner in another container that shares this
/tmp from being taken for a dead one; where it cannot be read (not Linux), folders carry no
owner and nothing is removed."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from autotune.trial.processes import process_alive

PREFIX = "autotune-trial-"


def folder_prefix() -> str:
    """The name prefix of this process's trial folders."""
    namespace = _pid_namespace()
    return PREFIX if namespace is None else f"{PREFIX}{namespace}-{os.getpid()}-"


def remove_orphaned_folders(root: Path | None = None) -> list[Path]:
    """Remove the trial folders under `root` (the temporary folder) whose tuner, in this PID
    namespace, is no longer running; the ones removed."""
    namespace = _pid_namespace()
    if namespace is None:
        return []
    mine = f"{PREFIX}{namespace}-"
    removed = []
    for path in Path(root or tempfile.gettempdir()).glob(f"{mine}*-*"):
        pid = path.name[len(mine) :].split("-", 1)[0]
        if pid.isdigit() and path.is_dir() and not path.is_symlink() and not process_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)  # another user's stays: not ours to force
            if not path.exists():
                removed.append(path)
    return removed


def _pid_namespace() -> int | None:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None
