"""search --no-references: a new study without the baseline and checklist trials (the checklist
compiles: tens of seconds a study on a CPU). Trials are faked: what is tested is what the study
enqueues and what the summary then says."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from autotune.cli import main
from autotune.search.references import BASELINE, CHECKLIST
from autotune.study.storage import load_study
from tests.attack_helpers import FAST, fake_trials

STUDY = "gpt2-tiny-cpu"


def search(*args: str):
    return CliRunner().invoke(main, ["search", *FAST, "--json", *args])


def references(study) -> list[str]:
    return [t.user_attrs["reference"] for t in study.trials if t.user_attrs.get("reference")]


@pytest.mark.slow
def test_no_references_opens_a_study_without_them_and_the_summary_says_no_speedup(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fake_trials(monkeypatch)
    result = search("--n-trials", "2", "--no-references")
    assert result.exit_code == 0, result.output
    study = load_study(STUDY, None)
    assert references(study) == [] and len(study.trials) == 2
    summary = json.loads(result.stdout)
    assert summary["best"] is not None
    assert summary["speedup_vs_baseline"] is None and summary["speedup_vs_checklist"] is None


@pytest.mark.slow
def test_by_default_a_new_study_opens_with_both(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fake_trials(monkeypatch)
    result = search("--n-trials", "1")  # both are enqueued as the study opens: the checklist waits its turn
    assert result.exit_code == 0, result.output
    assert references(load_study(STUDY, None)) == [BASELINE, CHECKLIST]
