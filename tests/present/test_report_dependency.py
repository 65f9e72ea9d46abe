"""Plots are part of the product: matplotlib is a core dependency, and an environment without it
gets one clear line from `autotune report`, not a ModuleNotFoundError traceback."""

from __future__ import annotations

import sys
from pathlib import Path

import optuna
import pytest
from click.testing import CliRunner

from autotune.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_matplotlib_is_a_core_dependency():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert any(dep.startswith("matplotlib") for dep in project["dependencies"])


def test_report_without_matplotlib_says_so_in_one_line(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 's.db'}"
    optuna.create_study(study_name="s", storage=url, direction="maximize")
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    result = CliRunner().invoke(main, ["report", "--storage", url, "--study", "s", "--out", str(tmp_path / "r")])
    assert result.exit_code == 2
    assert result.stderr == (
        "Error: autotune report draws its figures with matplotlib, which is not installed: pip install matplotlib\n"
    )
