"""--memory-headroom (issue 16, item 2): a configuration is feasible only if its worst-case peak
is within the limit less the headroom (5 % by default); the study keeps its headroom on resume,
and the recipe records it with the margin to the limit. Trials are faked (no process)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from autotune.cli import main
from autotune.errors import UsageError
from autotune.measure.outcomes import DEFAULT_MEMORY_HEADROOM, memory_constraint
from autotune.search.preflight import memory_headroom
from autotune.search.settings import SearchSettings
from tests.attack_helpers import fake_trials
from tests.search.test_resume_rules import STUDY, resumable, resumable_made, search  # noqa: F401  (fixtures)

MiB = 1 << 20
PEAK = int(338.5 * MiB)


def test_the_constraint_is_the_peak_against_the_limit_less_the_headroom():
    assert DEFAULT_MEMORY_HEADROOM == 0.05
    assert memory_constraint(940, 1000, 0.05) == pytest.approx(-0.01)  # within 950: feasible
    assert memory_constraint(960, 1000, 0.05) == pytest.approx(0.01)  # within the limit, not the headroom
    assert memory_constraint(960, 1000, 0.0) == pytest.approx(-0.04)  # no headroom: the limit itself
    assert memory_constraint(None, 1000, 0.05) == 0.0


@pytest.mark.slow
def test_a_peak_within_the_limit_but_not_the_headroom_is_no_best(tmp_path, monkeypatch):
    """338.5 MiB against 350 MiB is 96.7 %: within the limit, over its 5 % headroom: no best."""
    monkeypatch.chdir(tmp_path)
    fake_trials(monkeypatch, peak=PEAK)
    result = search("--memory-limit", "350MiB", "--n-trials", "2")
    assert result.exit_code == 1, result.output
    assert result.stderr.endswith("Error: no trial fits the memory limit; no recipe written\n")


def test_a_recipe_records_the_headroom_it_was_judged_with(resumable):  # noqa: F811
    measured = json.loads((resumable / "recipes" / f"{STUDY}.json").read_text())["measured"]
    assert measured["memory_headroom"] == 0.05 and measured["memory_margin_bytes"] == 21 * 1024**3 - PEAK


@pytest.mark.slow
def test_resuming_with_another_headroom_is_refused_and_without_one_keeps_the_studys(resumable):  # noqa: F811
    result = search("--memory-headroom", "10%", "--n-trials", "1")
    assert result.exit_code == 2
    assert "was measured with --memory-headroom 5%, this run 10%: trials measured under other rules" in result.stderr
    result = search("--n-trials", "1")
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("value", [-0.01, 0.51])
def test_a_headroom_out_of_range_is_refused(value):
    with pytest.raises(UsageError, match=rf"^--memory-headroom must be from 0% to 50%, got {value:g}$"):
        memory_headroom(SearchSettings(memory_headroom=value))


def test_the_help_says_the_default_and_why():
    text = " ".join(CliRunner().invoke(main, ["search", "--help"]).output.split())
    assert "--memory-headroom" in text and "(default 5%: fragmentation over hours of training" in text
