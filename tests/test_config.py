"""autotune.config and the commands' input: RunSpec refuses a negative minimum time; bad input
(--devices, a recipe of a newer format or with Python objects in it) is one clear error, exit
2, and writes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.config import RunSpec
from autotune.errors import UsageError
from tests.helpers import invoke


def test_min_time_must_not_be_negative():
    with pytest.raises(UsageError, match="min_time_s must be a number of seconds >= 0"):
        RunSpec(min_time_s=-1)


def _files_under(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*")}


def _bad_input(tmp_path: Path, monkeypatch, args: list[str]):
    monkeypatch.chdir(tmp_path)
    before = _files_under(tmp_path)
    result = invoke(*args)
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert result.stderr.startswith("Error: ") and result.stderr.count("\n") == 1, result.stderr
    assert _files_under(tmp_path) == before, "bad input must write nothing"
    return result.stderr


def test_bad_devices_for_search(tmp_path, monkeypatch):
    assert "--devices:" in _bad_input(tmp_path, monkeypatch, ["search", "--devices", "0,zero", "--model", "gpt2-tiny"])


def _recipe_text() -> str:
    from autotune.config import TrainConfig
    from autotune.recipe.recipe import Recipe

    return json.dumps(
        Recipe(
            config=TrainConfig(),
            model={"name": "gpt2-tiny"},
            data="synthetic",
            measured={},
            reference_speedups={},
            hardware={},
            software={},
            study={},
            created="now",
        ).to_dict()
    )


@pytest.mark.parametrize("command", [["export"], ["verify"]])
def test_recipe_of_a_newer_format_is_refused_by_the_commands(tmp_path, monkeypatch, command):
    raw = json.loads(_recipe_text()) | {"version": 99}
    (tmp_path / "new.json").write_text(json.dumps(raw))
    message = _bad_input(tmp_path, monkeypatch, command + ["new.json"])
    assert "new.json" in message and "newer" in message


@pytest.mark.parametrize("command", [["export"], ["verify"]])
def test_recipe_with_python_objects_is_refused_and_nothing_runs(tmp_path, monkeypatch, command):
    marker = tmp_path / "pwned"
    (tmp_path / "evil.yaml").write_text(
        f'format: autotune.recipe\nversion: 1\nconfig: {{}}\ndata: !!python/object/apply:os.system ["touch {marker}"]\n'
    )
    message = _bad_input(tmp_path, monkeypatch, command + ["evil.yaml"])
    assert "evil.yaml" in message and not marker.exists()


@pytest.mark.parametrize("what", ["recipe", "space"])
def test_a_fifo_as_a_recipe_or_space_is_refused_without_hanging(tmp_path, what):
    """The regular-file check came after a blocking open(): a FIFO with no writer hung forever."""
    import os
    import threading

    from autotune.recipe import Recipe
    from autotune.space.file import load_space

    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    outcome: list[BaseException | None] = []

    def read() -> None:
        try:
            Recipe.load(fifo) if what == "recipe" else load_space(fifo)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            outcome.append(exc)
        else:
            outcome.append(None)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(5)
    hung = reader.is_alive()
    if hung:  # let the blocked open() return, so the thread ends
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(5)
    assert not hung, "reading a FIFO hung"
    assert isinstance(outcome[0], UsageError) and "not a regular file" in str(outcome[0])
