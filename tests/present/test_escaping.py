"""Text a user (or a file, a study, a model) provides is printed escaped (issue E): ANSI escapes,
right-to-left marks and newlines from recipe fields and file paths were printed raw, so they
could clear the screen or forge a log line, and an error message could span two lines."""

from __future__ import annotations

import json
import logging

import optuna
import pytest
from click.testing import CliRunner

from autotune.cli import main
from tests.recipe.test_recipe_safety import recipe_dict

CLEAR = "\x1b[2J"
RTL = "\u202e"
FORGED = "\nINFO autotune: all trials passed"
HOSTILE = f"evil{CLEAR}{RTL}{FORGED}"


def raw_controls(text: str) -> list[str]:
    """Terminal controls left raw (newlines that the output itself puts between its lines aside)."""
    return [c for c in text if c in "\x1b\r\u202e\u2066\u200f" or (ord(c) < 32 and c not in "\n")]


def test_printable_escapes_controls_marks_and_newlines():
    from autotune.errors import printable

    assert printable(HOSTILE) == "evil\\x1b[2J\\u202e\\nINFO autotune: all trials passed"
    assert printable("tab\there, caf\u00e9, \u4e2d\u6587") == "tab\\there, caf\u00e9, \u4e2d\u6587"
    assert printable("a\nb", newlines=True) == "a\nb"
    assert printable(f"x{CLEAR}\ny", newlines=True) == "x\\x1b[2J\ny"


def test_an_error_naming_a_hostile_path_is_one_escaped_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["export", f"r{CLEAR}{FORGED}.json"])
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and not raw_controls(result.stderr), repr(result.stderr)
    assert "\\x1b[2J\\nINFO autotune" in result.stderr


def test_recipe_fields_are_printed_escaped(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    raw = recipe_dict(model__name="gpt2-tiny", hardware={"name": HOSTILE, "kind": "cpu"})
    path = tmp_path / f"r{RTL}.json"
    path.write_text(json.dumps(raw))

    def measured(*args, **kwargs):
        from autotune.trial.runner import TrialResult

        return TrialResult("crashed", HOSTILE)

    monkeypatch.setattr("autotune.recipe.verify.run_trial", measured)
    result = CliRunner().invoke(main, ["verify", str(path), "--device", "cpu"])
    assert "Warning: this recipe was measured elsewhere" in result.stderr, result.output
    assert not raw_controls(result.output), repr(result.output)
    assert "evil\\x1b[2J" in result.stderr and "r\\u202e.json" in result.stdout


def test_a_study_of_hostile_names_is_shown_escaped(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    url = f"journal:{tmp_path / 's.journal'}"
    from autotune.study.storage import open_storage

    study = optuna.create_study(study_name=f"s{CLEAR}", storage=open_storage(url), direction="maximize")
    study.set_user_attr("model", HOSTILE)
    study.set_user_attr("hardware", {"name": HOSTILE})
    trial = optuna.trial.create_trial(
        state=optuna.trial.TrialState.FAIL, user_attrs={"outcome": "crashed", "reason": f"boom{CLEAR}"}
    )
    study.add_trial(trial)
    listed = CliRunner().invoke(main, ["show", "--storage", url, "--study", f"s{CLEAR}"])
    assert listed.exit_code == 0, listed.output
    assert not raw_controls(listed.output) and "\\x1b[2J" in listed.output, repr(listed.output)
    assert "INFO autotune: all trials passed" not in listed.output.splitlines()  # not a line of its own
    both = CliRunner().invoke(main, ["show", "--storage", url])
    assert both.exit_code == 0 and not raw_controls(both.output), repr(both.output)


def test_log_lines_are_escaped(caplog):
    from autotune.cli import OneLineFormatter

    record = logging.LogRecord("autotune.x", logging.WARNING, __file__, 1, "journal %s: cut", (HOSTILE,), None)
    line = OneLineFormatter("%(levelname)s %(name)s: %(message)s").format(record)
    assert "\n" not in line and not raw_controls(line)


@pytest.mark.parametrize("text", ["\x00", "\x7f", "\x9b", "\u2028", "\ufeff"])
def test_every_kind_of_invisible_control_is_escaped(text):
    from autotune.errors import printable

    assert not raw_controls(printable(text)) and printable(text).startswith("\\")
