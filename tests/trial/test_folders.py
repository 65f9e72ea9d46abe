"""autotune.trial.folders: a killed tuner's trial folders are removed by the next search; a
running tuner's, another namespace's and anything else are left alone."""

from __future__ import annotations

import os
import subprocess

from autotune.trial.folders import PREFIX, folder_prefix, remove_orphaned_folders


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()  # exited and reaped: no process has this pid now
    return proc.pid


def test_a_folder_is_named_after_its_tuner_and_namespace():
    namespace = os.stat("/proc/self/ns/pid").st_ino
    assert folder_prefix() == f"{PREFIX}{namespace}-{os.getpid()}-"


def test_the_folders_of_gone_tuners_are_removed_and_nothing_else(tmp_path):
    namespace = os.stat("/proc/self/ns/pid").st_ino
    gone = tmp_path / f"{PREFIX}{namespace}-{dead_pid()}-k2j4x_9q"
    running = tmp_path / f"{folder_prefix()}a8b7c6d5"
    elsewhere = tmp_path / f"{PREFIX}{namespace + 1}-{dead_pid()}-zz11yy22"  # another container's
    unowned = tmp_path / f"{PREFIX}3ra8u8au"  # the old naming: whose it is cannot be told
    for folder in (gone, running, elsewhere, unowned):
        folder.mkdir()
        (folder / "result.json").write_text("{}")
    a_file = tmp_path / f"{PREFIX}{namespace}-{dead_pid()}-file"
    a_file.write_text("not ours")
    assert remove_orphaned_folders(tmp_path) == [gone]
    assert not gone.exists() and running.is_dir() and elsewhere.is_dir() and unowned.is_dir() and a_file.is_file()


def test_a_folder_that_cannot_be_removed_is_not_reported_removed(tmp_path, monkeypatch):
    import autotune.trial.folders as folders

    namespace = os.stat("/proc/self/ns/pid").st_ino
    stuck = tmp_path / f"{PREFIX}{namespace}-{dead_pid()}-stuck000"
    stuck.mkdir()
    monkeypatch.setattr(folders.shutil, "rmtree", lambda path, ignore_errors=False: None)  # e.g. another user's files
    assert remove_orphaned_folders(tmp_path) == [] and stuck.is_dir()
