"""`-v/--verbose` before the command (`autotune -v show`) and after it (`autotune show -v`),
with the same effect: autotune's INFO lines are logged while the command runs (issue D, #10:
`autotune search -v ...` was refused as an unknown option)."""

from __future__ import annotations

import logging

import pytest

import autotune.present.compare
import autotune.present.summaries
import autotune.study.catalog
from autotune.errors import UsageError
from tests.helpers import invoke


@pytest.fixture
def verbosity_seen(monkeypatch):
    """What `show` (listing studies) and `compare` see: whether INFO lines are logged."""
    seen: list[bool] = []

    def record(*args, **kwargs):
        seen.append(logging.getLogger("autotune").isEnabledFor(logging.INFO))
        return []

    def record_and_refuse(*args, **kwargs):
        record()
        raise UsageError("no comparison in this test")

    monkeypatch.setattr(autotune.study.catalog, "list_studies", record)
    monkeypatch.setattr(autotune.present.summaries, "studies_text", lambda entries: "no studies")
    monkeypatch.setattr(autotune.present.compare, "load_comparison", record_and_refuse)
    return seen


@pytest.mark.parametrize(
    ("command", "exit_code"), [(["show"], 0), (["compare", "a.db", "b.db"], 2)], ids=["show", "compare"]
)
def test_verbose_is_taken_before_and_after_the_command_with_the_same_effect(verbosity_seen, command, exit_code):
    level = logging.getLogger().level
    for args, verbose in [
        (command, False),
        (["-v", *command], True),
        ([*command, "-v"], True),
        ([command[0], "--verbose", *command[1:]], True),
    ]:
        result = invoke(*args)
        assert result.exit_code == exit_code, (args, result.output)
        assert "No such option" not in result.output
        assert verbosity_seen.pop() is verbose, args
        assert logging.getLogger().level == level  # the command's verbosity ends with it
