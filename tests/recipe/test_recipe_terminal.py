"""A shared recipe or study whose text fields hold terminal escapes and a newline (issue D, N18:
`hardware.name` "\\x1b[2J\\nFAKE LINE" cleared the screen and forged a line in the "measured
elsewhere" warning). Every such field reaches a terminal escaped (`errors.printable`)."""

from __future__ import annotations

import warnings

import pytest

from autotune.errors import RecipeEnvironmentWarning
from autotune.recipe import Recipe
from tests.helpers import cpu_recipe, invoke, save_recipe, synthetic_study

HOSTILE = "\x1b[2J\nFAKE LINE"


def forged(output: str) -> bool:
    """Whether `output` drives the terminal or holds a line the hostile value started."""
    return "\x1b" in output or any(line.startswith("FAKE") for line in output.splitlines())


def hostile_recipe(tmp_path):
    recipe = cpu_recipe()
    recipe.hardware["name"] = HOSTILE
    recipe.software["torch"] = "\x1b[31m2.0\nFAKE TORCH"
    return save_recipe(recipe, tmp_path / "r.json")


def test_the_measured_elsewhere_warning_of_a_loaded_recipe_is_one_escaped_line(tmp_path):
    path = hostile_recipe(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Recipe.load(path)
    (warning,) = [w for w in caught if issubclass(w.category, RecipeEnvironmentWarning)]
    text = str(warning.message)
    assert not forged(text) and "\n" not in text
    assert "measured on \\x1b[2J\\nFAKE LINE" in text and "torch \\x1b[31m2.0\\nFAKE TORCH there" in text


def test_export_of_a_recipe_says_where_it_was_measured_in_one_escaped_line(tmp_path):
    path = hostile_recipe(tmp_path)
    for fmt in ("json", "hf", "env"):
        result = invoke("export", str(path), "--format", fmt)
        assert result.exit_code == 0, result.output
        assert not forged(result.output), result.output
        said = [line for line in result.output.splitlines() if "measured elsewhere" in line]
        assert len(said) == 1 and "\\x1b[2J\\nFAKE LINE" in said[0], result.output


@pytest.mark.slow
def test_a_studys_hardware_name_reaches_no_terminal_raw(tmp_path, monkeypatch):
    """`report` put it in its figures' titles, and matplotlib warned of the missing ESC glyph
    with the ESC itself; `show` and `compare` print it in their tables."""
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "h200.db"
    study = synthetic_study(f"sqlite:///{db}", n=6)
    study.set_user_attr("hardware", {**study.user_attrs["hardware"], "name": HOSTILE})
    for args in (
        ["show", "--storage", str(db)],
        ["compare", str(db), str(db)],
        ["report", "--storage", str(db), "--out", str(tmp_path / "report")],
    ):
        with warnings.catch_warnings(record=True) as caught:  # printed on stderr outside pytest
            warnings.simplefilter("always")
            result = invoke(*args)
        assert result.exit_code == 0, result.output
        said = [result.output, *(str(w.message) for w in caught)]
        assert not any(forged(text) for text in said), (args, said)
