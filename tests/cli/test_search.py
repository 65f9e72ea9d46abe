"""`autotune search` end to end on gpt2-tiny and a CPU (the session's `searched` study): the study
and the recipe it writes, resuming it, and the command's errors. No assertion is about
speed: the CPU is shared."""

from __future__ import annotations

import json
import shutil

import pytest
from optuna.trial import TrialState

from autotune.config import TrainConfig
from autotune.recipe.recipe import Recipe
from autotune.search.preflight import preflight
from autotune.search.references import baseline_config, checklist_config
from autotune.space.file import load_space
from autotune.study.storage import load_study
from autotune.study.summary import summarize
from tests.helpers import FAST, SEARCHED_SEED, SPACES, STUDY, TINY_SPACE, invoke, nothing_written, search_settings


@pytest.mark.process
def test_search_writes_study_and_recipe(searched, monkeypatch):
    where, result = searched.where, searched.result
    monkeypatch.chdir(where)
    assert result.exit_code == 0, result.output
    assert (where / "studies" / f"{STUDY}.db").is_file()
    assert (where / "recipes" / f"{STUDY}.json").is_file()
    out = result.stdout
    assert f"study {STUDY}: 4 trials (" in out
    assert "speedup vs baseline" in out and "speedup vs checklist" in out
    assert f"recipe: recipes/{STUDY}.json" in out

    study = load_study(STUDY, None)
    trials = study.trials
    assert [t.number for t in trials] == [0, 1, 2, 3]
    assert [t.user_attrs.get("reference") for t in trials] == ["baseline", "checklist", None, None]
    assert trials[0].user_attrs["config"] == baseline_config(128).to_dict()
    caps = preflight(search_settings()).task.capabilities
    checklist, _ = checklist_config(128, caps)
    assert trials[1].user_attrs["config"] == checklist.to_dict()
    assert checklist.compile_mode == "default" and not checklist.pin_memory
    assert checklist.amp_dtype == ("bfloat16" if caps.cpu_bf16 else "float32")
    assert any(n.startswith("pin_memory changed") for n in trials[1].user_attrs["reference_notes"])
    for t in trials:
        assert t.state == TrialState.COMPLETE and t.user_attrs["outcome"] == "ok", (t.number, t.user_attrs)
        assert t.constraints["memory"] <= 0
        assert t.value == t.user_attrs["tokens_per_sec"] > 0
        if "duplicate_of" not in t.user_attrs:  # a re-proposed configuration is not run again
            assert t.user_attrs["trial_pid"] and t.user_attrs["wall_s"] > 0 and "total" in t.user_attrs["phase_s"]
    for t in trials[2:]:  # sampled from the space
        cfg = t.user_attrs["config"]
        assert cfg["batching"] == "padded" and cfg["token_budget"] in (1024, 2048)
        assert cfg["sdpa_backend"] in ("math", "flash") and cfg["compile_mode"] == "none"

    attrs = study.user_attrs
    assert attrs["space_hash"] == load_space(str(TINY_SPACE)).hash
    assert attrs["identity"]["model"] == "gpt2-tiny" and attrs["seq_len"] == 128 and attrs["n_layer"] == 2
    assert attrs["run"] == {
        "warmup": 1,
        "steps": 4,
        "min_time_s": 0.0,
        "seed": SEARCHED_SEED,
        "global_batch_tokens": None,
    }

    summary = summarize(study)
    best = summary.best
    # The best single run leads; the leaders it cannot be told from were re-measured (steps 4:
    # too few for an interval, so none can be told apart) and the best mean is the best.
    assert summary.leaders[0].value == max(t.value for t in trials)
    remeasured = [c for c in summary.leaders if c.remeasured]
    assert len(remeasured) == len(summary.leaders) and best.number in [c.number for c in remeasured]
    assert max(c.mean for c in remeasured) == next(c.mean for c in remeasured if c.number == best.number)
    assert f"best: trial #{best.number}" in out
    recipe = Recipe.load(where / "recipes" / f"{STUDY}.json")
    assert recipe.config == TrainConfig.from_dict(best.config)
    assert recipe.study["name"] == STUDY and recipe.study["trial"] == best.number
    # the winner's curse: the best was measured once more, and the recipe reports the mean of its runs
    confirmation = attrs[f"confirmation:{best.number}"]
    assert confirmation["outcome"] == "ok" and confirmation["tokens_per_sec"] > 0
    runs = [best.tokens_per_sec, confirmation["tokens_per_sec"]]
    assert best.figure == pytest.approx(sum(runs) / 2)  # what show, compare and report print
    assert recipe.measured["tokens_per_sec_runs"] == pytest.approx(runs)
    assert recipe.measured["tokens_per_sec"] == pytest.approx(sum(runs) / 2)
    assert recipe.reference_speedups["baseline"] == pytest.approx(summary.speedup(summary.baseline))
    assert recipe.reference_speedups["checklist"] == pytest.approx(summary.speedup(summary.checklist))
    assert recipe.model["name"] == "gpt2-tiny"


@pytest.mark.process
def test_resume_with_another_space_is_refused(searched, tmp_path, monkeypatch):
    where = shutil.copytree(searched.where, tmp_path / "refused")  # the session's study is only read
    monkeypatch.chdir(where)
    before = len(load_study(STUDY, None).trials)
    other = str(SPACES / "unsupported.yaml")
    result = invoke("search", "--model", "gpt2-tiny", *FAST, "--n-trials", "1", "--space", other)
    assert result.exit_code == 2
    old, new = load_space(str(TINY_SPACE)).hash, load_space(other).hash
    assert result.stderr == (
        f"Error: study '{STUDY}' was made for search space (hash) {old}, this run is search "
        f"space (hash) {new}: resume it with the same settings, or choose a new name with --study\n"
    )
    assert len(load_study(STUDY, None).trials) == before


@pytest.mark.process
def test_search_again_adds_trials_to_the_study(searched, tmp_path, monkeypatch):
    where = shutil.copytree(searched.where, tmp_path / "again")  # the session's study stays as it was
    monkeypatch.chdir(where)
    result = invoke("search", "--model", "gpt2-tiny", *FAST, "--n-trials", "1", "--space", str(TINY_SPACE), "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["study"] == STUDY and summary["n_trials"] == 5
    assert sum(summary["counts"].values()) == 5
    assert summary["best"]["outcome"] == "ok" and summary["best"]["tokens_per_sec"] > 0
    assert summary["speedup_vs_baseline"] > 0 and summary["speedup_vs_checklist"] > 0
    assert summary["baseline"]["number"] == 0 and summary["checklist"]["number"] == 1
    assert summary["recipe"] == f"recipes/{STUDY}.json"
    trials = load_study(STUDY, None).trials
    assert [t.number for t in trials] == list(range(5))
    assert [t.number for t in trials if t.user_attrs.get("reference")] == [0, 1]  # not enqueued again
    recipe = Recipe.load(where / summary["recipe"])
    assert recipe.config.to_dict() == summary["best"]["config"]


BAD_INPUT = [
    (["--memory-limit", "-5GiB"], "Error: --memory-limit: the memory size must be positive, got '-5GiB'"),
    (
        ["--memory-limit", "lots"],
        "Error: --memory-limit: cannot read 'lots' as a memory size; expected e.g. 60GiB, 512MiB or 8000000000",
    ),
    (
        ["--model", "nope"],
        "Error: unknown model 'nope': expected one of gpt2, gpt2-medium, gpt2-large, gpt2-xl, gpt2-tiny, "
        "hf:gpt2, hf:gpt2-medium, hf:gpt2-large, hf:gpt2-xl, hf:gpt2-tiny, hf:smollm-135m, hf:llama-tiny, "
        "hf:PATH (a local Hugging Face config directory) or package.module:factory",
    ),
    pytest.param(  # search builds a user's factory in a trial process first (trial.probe)
        ["--model", "tests.fault_models:missing"],
        "Error: model 'tests.fault_models:missing': tests.fault_models has no callable 'missing'",
        marks=pytest.mark.process,
    ),
    (
        ["--space", str(SPACES / "malformed.yaml")],
        f"Error: search space {SPACES / 'malformed.yaml'}: malformed YAML at line 4 "
        "(expected ',' or '}', but got '<scalar>')",
    ),
    (
        ["--space", str(SPACES / "unknown_key.yaml")],
        f"Error: search space {SPACES / 'unknown_key.yaml'}: dimensions.sdpa_backend.choice: unknown key; "
        "expected choices, high, log, low, step, when",
    ),
    (["--space", "nowhere.yaml"], "Error: search space nowhere.yaml: cannot read it (No such file or directory)"),
    (["--n-trials", "0"], "Error: --n-trials: expected a whole number from 1 to 1000000, got '0'"),
    (["--timeout", "10x"], "Error: --timeout: cannot read '10x' as a duration; expected e.g. 90s, 10m or 2h"),
    (["--trial-timeout", "0s"], "Error: --trial-timeout: the duration must be positive, got '0s'"),
    (["--memory-fraction", "2"], "Error: --memory-fraction: expected a number above 0 and at most 1, got '2'"),
]


@pytest.mark.parametrize(
    "args, message",
    BAD_INPUT,
    ids=[" ".join((case.values if hasattr(case, "marks") else case)[0]) for case in BAD_INPUT],
)
def test_search_bad_input(workdir, args, message):
    result = invoke("search", *FAST, "--space", str(TINY_SPACE), *args)
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines()[-1] == message
    assert result.stdout == ""
    assert nothing_written(workdir)


def test_storage_password_never_shown(workdir):
    url = "postgresql://tuner:s3cret@127.0.0.1:1/db"
    result = invoke("search", "--model", "gpt2-tiny", *FAST, "--space", str(TINY_SPACE), "--storage", url)
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith("Error: storage postgresql://tuner:***@127.0.0.1:1/db: cannot open it (")
    assert "s3cret" not in result.output
    assert nothing_written(workdir)
    shown = invoke("show", "--storage", url)
    assert shown.exit_code == 2 and "s3cret" not in shown.output and "tuner:***@" in shown.stderr
