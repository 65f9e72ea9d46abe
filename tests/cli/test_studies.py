"""`autotune show` and `autotune export --study`: a stored study read back (the session's
`searched` study), best first, and the errors when there is none."""

from __future__ import annotations

import json
import shutil
import types

import pytest

from autotune.config import TrainConfig
from autotune.recipe.recipe import Recipe
from autotune.study.storage import load_study
from autotune.study.summary import summarize
from tests.helpers import STUDY, invoke, nothing_written


@pytest.mark.process
def test_show_json_lists_trials_best_first(searched, monkeypatch):
    where = searched.where
    monkeypatch.chdir(where)
    result = invoke("show", "--study", STUDY, "--json")
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    study = load_study(STUDY, None)
    best = summarize(study).best
    assert shown["study"] == STUDY and shown["model"] == "gpt2-tiny"
    assert shown["best"]["number"] == best.number
    assert shown["trials"][0]["number"] == best.number
    assert {t["number"] for t in shown["trials"]} == {t.number for t in study.trials}
    rates = [t["tokens_per_sec"] for t in shown["trials"][1:] if t["outcome"] == "ok"]  # after the best
    assert rates == sorted(rates, reverse=True)
    assert sum(shown["counts"].values()) == len(study.trials)
    assert shown["speedup_vs_baseline"] > 0 and shown["speedup_vs_checklist"] > 0

    text = invoke("show", "--study", STUDY)
    assert text.exit_code == 0 and f"study {STUDY}: model gpt2-tiny" in text.stdout
    assert "speedup vs baseline" in text.stdout


@pytest.mark.process
def test_export_study_writes_the_best_recipe(searched, tmp_path, monkeypatch):
    where = shutil.copytree(searched.where, tmp_path / "export")  # out.json is not written among the session's files
    monkeypatch.chdir(where)
    result = invoke("export", "--study", STUDY, "-o", "out.json")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "wrote out.json"
    best = summarize(load_study(STUDY, None)).best
    exported = Recipe.load(where / "out.json")
    assert exported.config == TrainConfig.from_dict(best.config)
    assert exported.config == Recipe.load(where / "recipes" / f"{STUDY}.json").config
    assert exported.study["trial"] == best.number


def test_show_and_export_errors(workdir):
    result = invoke("show", "--study", "nope")
    assert result.exit_code == 2
    assert result.stderr == "Error: storage sqlite:///studies/nope.db: no such database file\n"
    result = invoke("export")
    assert result.exit_code == 2
    assert result.stderr == "Error: give either a RECIPE file or --study (with --storage when not the default)\n"
    assert nothing_written(workdir)


def test_ctrl_c_stops_the_dashboard_with_130_and_one_line(workdir, monkeypatch):
    """Ctrl-C anywhere exits 130 with one line (issue 14), the dashboard's server included."""
    import optuna

    import autotune.cli.studies

    (workdir / "studies").mkdir()
    optuna.create_study(study_name="s", storage="sqlite:///studies/s.db")

    def interrupted(storage, **kwargs):
        raise KeyboardInterrupt

    server = types.SimpleNamespace(run_server=interrupted)
    monkeypatch.setattr(autotune.cli.studies, "require_dashboard", lambda: server)
    result = invoke("dashboard", "--study", "s", "--port", "8765")
    assert result.exit_code == 130, result.output
    assert result.stderr.splitlines()[-1] == "Error: interrupted (Ctrl-C)"
