"""docs/reliability.md, the fault matrix: every row names tests, and every test it names exists
(a renamed or deleted test would otherwise leave a row claiming a proof that is gone)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MATRIX = ROOT / "docs" / "reliability.md"


def named_tests(row: str) -> list[str]:
    """`tests/x.py::name` and bare `::name` (the file named before it in the same cell)."""
    names, last = [], None
    for path, name in re.findall(r"(tests/[\w/]+\.py)?(?:::(\w+))?", row):
        if path:
            last = path
            names.append(path)
        if name:
            names.append(f"{last}::{name}")
    return names


def missing_tests(text: str) -> list[str]:
    missing = []
    for row in re.findall(r"^\| \d+ \|.*$", text, re.M):
        for name in named_tests(row):
            path, _, func = name.partition("::")
            file = ROOT / path
            if not file.is_file() or (func and not re.search(rf"^\s*(async )?def {func}\(", file.read_text(), re.M)):
                missing.append(name)
    return missing


def test_every_row_names_a_test_and_every_named_test_exists():
    text = MATRIX.read_text()
    rows = [int(n) for n in re.findall(r"^\| (\d+) \|.*$", text, re.M)]
    # numbered from 1 in order, each once; a range kept for another branch's rows may leave a gap
    assert rows[0] == 1 and all(a < b for a, b in zip(rows, rows[1:])) and len(rows) >= 32
    assert all(named_tests(row) for row in re.findall(r"^\| \d+ \|.*$", text, re.M))
    assert missing_tests(text) == []


def test_a_renamed_test_is_caught():
    row = "| 1 | f | e | `tests/test_reliability_doc.py::test_a_renamed_test_is_caught`, `::no_such_test` |"
    assert missing_tests(row) == ["tests/test_reliability_doc.py::no_such_test"]
    assert missing_tests("| 2 | f | e | `tests/nowhere.py` |") == ["tests/nowhere.py"]
