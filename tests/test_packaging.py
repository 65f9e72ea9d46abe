"""The package as users install it: a built wheel carries the default search spaces, and a
non-editable install finds them (they live in search_spaces/ at the repository root)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SPACES = sorted(p.name for p in (ROOT / "search_spaces").glob("*.yaml"))

# One pytest-xdist worker runs this module, so that its module-scoped wheel is built once,
# not in each worker.
pytestmark = [pytest.mark.process, pytest.mark.xdist_group("packaging")]


# What a checkout may hold that is not its source: setuptools reuses build/, and a build/ from an
# older layout put modules that no longer exist into the wheel (autotune/search.py, which imported
# what was gone). The wheel is built from a copy of the source alone.
NOT_SOURCE = shutil.ignore_patterns(
    ".git", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis", "studies", "recipes"
)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    source = tmp_path_factory.mktemp("source") / "autotune"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCE, symlinks=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-q", "-w", str(out)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = out.glob("autotune-*.whl")
    return built


def test_the_wheel_carries_the_default_search_spaces(wheel):
    """Every YAML in search_spaces/ (not a fixed list: a space added there ships too), and
    nothing else under autotune/search_spaces/."""
    prefix = "autotune/search_spaces/"
    shipped = sorted(n.removeprefix(prefix) for n in zipfile.ZipFile(wheel).namelist() if n.startswith(prefix))
    assert {"cpu.yaml", "gpt2.yaml"} <= set(SPACES)  # the defaults for a CPU and a GPU are among them
    assert shipped == SPACES


def test_the_wheel_carries_the_packages_modules_and_no_other(wheel):
    modules = {n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".py")}
    source = {str(p.relative_to(ROOT)) for p in (ROOT / "autotune").rglob("*.py") if "__pycache__" not in p.parts}
    assert modules == source


def test_an_installed_wheel_finds_its_spaces_outside_the_repository(wheel, tmp_path):
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    code = (
        "import autotune, sys; from autotune.space.file import default_space_path, load_space; "
        "print(autotune.__file__); [print(load_space(default_space_path(k)).source) for k in ('cpu', 'cuda')]"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    package, cpu, cuda = proc.stdout.split()
    assert package.startswith(str(site))  # the installed copy, not the repository
    assert cpu == str(site / "autotune" / "search_spaces" / "cpu.yaml")
    assert cuda == str(site / "autotune" / "search_spaces" / "gpt2.yaml")
