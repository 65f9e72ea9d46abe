"""The AUTOTUNE_* environment variables (issue E): a huge AUTOTUNE_HEARTBEAT_S killed the
heartbeat thread with OverflowError and heartbeats silently stopped. Every variable autotune
reads is validated at the start of a command: one line naming it and what it takes, exit 2."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from autotune import environment
from autotune.cli import main
from autotune.errors import UsageError

ROOT = Path(__file__).resolve().parent.parent

BAD = {
    environment.HEARTBEAT_S: ["1" + "0" * 30, "0", "-5", "soon", "9" * 5000, "1e3"],
    environment.LOCK_WAIT_S: ["-1", "86401", "2m", "9" * 5000],
    environment.MAX_NUM_WORKERS: ["-1", "1025", "many", "9" * 5000],
    environment.TRIAL_START: ["forkk", "Exec", "spawn"],
    environment.STORAGE: ["sqlite:///a.db\n\x1b[2J", "x" * 5000],
    environment.TRIAL_TOKEN: ["not hex", "ab\ncd"],
}
CASES = [(name, raw) for name, values in BAD.items() for raw in values]


def test_every_autotune_variable_the_code_reads_is_declared():
    """A new AUTOTUNE_* variable must be declared in autotune/environment.py (and so validated)."""
    read = set()
    for path in (ROOT / "autotune").rglob("*.py"):
        read |= set(re.findall(r"\bAUTOTUNE_[A-Z_]+\b", path.read_text(encoding="utf-8")))
    read -= {"AUTOTUNE_STATIC", "AUTOTUNE_S"}  # constants of search/priors.py (max-autotune), not variables
    assert read == set(environment.VARIABLES)


def test_a_huge_heartbeat_is_refused_instead_of_killing_the_heartbeat_thread(monkeypatch):
    from autotune.study.storage import heartbeat_interval_s

    monkeypatch.setenv("AUTOTUNE_HEARTBEAT_S", "1" + "0" * 30)
    with pytest.raises(UsageError, match="AUTOTUNE_HEARTBEAT_S: expected a whole number of seconds from 1 to 86400"):
        heartbeat_interval_s()


@pytest.mark.parametrize("name, raw", CASES, ids=[f"{n}={r[:12]!r}" for n, r in CASES])
def test_a_bad_variable_is_one_line_and_exit_2_at_the_start_of_a_command(tmp_path, monkeypatch, name, raw):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["show", "--storage", "x.db", "--study", "s"], env={name: raw})
    assert result.exit_code == 2, (result.output, result.exception)
    assert result.stderr.startswith(f"Error: {name}: expected ") and result.stderr.count("\n") == 1, result.stderr
    assert list(tmp_path.iterdir()) == []


def test_good_values_are_read_and_blank_is_unset(monkeypatch):
    monkeypatch.setenv("AUTOTUNE_HEARTBEAT_S", " 5 ")
    monkeypatch.setenv("AUTOTUNE_TRIAL_START", "exec")
    monkeypatch.setenv("AUTOTUNE_MAX_NUM_WORKERS", "")
    environment.check_environment()
    assert environment.value(environment.HEARTBEAT_S) == 5
    assert environment.value(environment.TRIAL_START) == "exec"
    assert environment.value(environment.MAX_NUM_WORKERS) is None
    from autotune.trial import fork_server

    assert not fork_server.fork_enabled()  # exec asked for
    monkeypatch.setenv("AUTOTUNE_TRIAL_START", "forkk")
    with pytest.raises(UsageError, match="AUTOTUNE_TRIAL_START: expected fork or exec"):
        fork_server.fork_enabled()
