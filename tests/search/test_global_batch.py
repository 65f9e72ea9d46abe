"""`search --global-batch-tokens N` and `bench --global-batch-tokens N`: every trial runs at the
study's global batch, which the study records and a resumed study keeps (another one is
refused); a token budget that does not divide it is pruned before any process starts, and a
space with none that does is refused; the recipe records the batch. Trials are faked (no
process) except in `bench`, which measures in this process."""

from __future__ import annotations

import json

import optuna
import pytest
from click.testing import CliRunner

from autotune.cli import main
from autotune.errors import UsageError
from autotune.measure import outcomes
from autotune.study.storage import load_study
from tests.attack_helpers import FAST, fake_trials

optuna.logging.set_verbosity(optuna.logging.WARNING)
STUDY = "gpt2-tiny-cpu"


def search(*args: str):
    return CliRunner().invoke(main, ["search", *FAST, *args])


@pytest.mark.slow
def test_every_trial_runs_at_the_global_batch_and_the_recipe_records_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    calls: list = []
    fake_trials(monkeypatch, calls=calls)
    result = search("--global-batch-tokens", "4096", "--n-trials", "4")
    assert result.exit_code == 0, result.output
    assert calls and all(spec.global_batch_tokens == 4096 for spec, _ in calls)
    study = load_study(STUDY, None)
    assert study.user_attrs["run"]["global_batch_tokens"] == 4096
    recipe = json.loads((tmp_path / "recipes" / f"{STUDY}.json").read_text())
    budget = recipe["config"]["token_budget"]
    assert recipe["batch"] == {
        "micro_batch_tokens": budget,
        "accumulation_steps": 4096 // budget,
        "global_batch_tokens": 4096,
    }


@pytest.mark.slow
def test_a_resumed_study_keeps_its_global_batch_and_refuses_another(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    calls: list = []
    fake_trials(monkeypatch, calls=calls)
    assert search("--global-batch-tokens", "4096", "--n-trials", "1").exit_code == 0
    trials = len(load_study(STUDY, None).trials)
    refused = search("--global-batch-tokens", "8192", "--n-trials", "1")
    assert refused.exit_code == 2
    assert "was measured with --global-batch-tokens 4096, this run 8192" in refused.stderr
    assert len(load_study(STUDY, None).trials) == trials
    calls.clear()
    resumed = search("--n-trials", "1")  # no option: the study's own
    assert resumed.exit_code == 0, resumed.output
    assert calls and all(spec.global_batch_tokens == 4096 for spec, _ in calls)


@pytest.mark.slow
def test_a_study_made_without_a_global_batch_refuses_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fake_trials(monkeypatch)
    assert search("--n-trials", "1").exit_code == 0
    refused = search("--global-batch-tokens", "4096", "--n-trials", "1")
    assert refused.exit_code == 2
    assert "was measured with --global-batch-tokens unset, this run 4096" in refused.stderr


@pytest.mark.slow
def test_a_budget_that_does_not_divide_the_global_batch_is_pruned_without_a_process(tmp_path, monkeypatch):
    """The planner never proposes a budget that does not divide the global batch; one enqueued by
    hand (a warm start of another study, say) is pruned before any process starts."""
    monkeypatch.chdir(tmp_path)
    calls: list = []
    fake_trials(monkeypatch, calls=calls)
    result = search("--global-batch-tokens", "1024", "--n-trials", "4")  # the space's budgets: 1024, 2048
    assert result.exit_code == 0, result.output
    assert calls and all(cfg.token_budget == 1024 for _, cfg in calls)
    study = load_study(STUDY, None)
    assert all(t.user_attrs["config"]["token_budget"] == 1024 for t in study.trials)
    study.enqueue_trial({"token_budget": 2048, "amp_dtype": "float32", "sdpa_backend": "math", "checkpoint_count": 0})
    ran = len(calls)
    assert search("--global-batch-tokens", "1024", "--n-trials", "1").exit_code == 0
    pruned = [t for t in load_study(STUDY, None).trials if t.params.get("token_budget") == 2048][-1]
    assert len(calls) == ran + 1  # no process for it: the one trial given ran a budget that divides
    assert pruned.state == optuna.trial.TrialState.PRUNED and pruned.user_attrs["outcome"] == outcomes.UNSUPPORTED
    assert pruned.user_attrs["reason"] == (
        "token_budget: 2048 tokens a micro-batch is more than the global batch of 1024 tokens"
    )


def test_a_global_batch_no_budget_of_the_space_divides_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fake_trials(monkeypatch)
    result = search("--global-batch-tokens", "3000", "--n-trials", "2")
    assert result.exit_code == 2
    assert result.stderr == (
        "Error: --global-batch-tokens 3000: no token_budget of the space (1024, 2048) divides it; "
        "choose a multiple of one of them\n"
    )
    assert not (tmp_path / "studies").exists()


def test_bench_accumulates_to_the_global_batch():
    args = ["bench", "--model", "gpt2-tiny", "--device", "cpu", "--warmup", "1", "--steps", "2", "--min-time", "0"]
    one_shape = ["--set", "batching=fixed"]  # one batch shape to warm up: the accumulation is the subject
    result = CliRunner().invoke(
        main, [*args, *one_shape, "--global-batch-tokens", "3072", "--set", "token_budget=1024", "--json"]
    )
    assert result.exit_code == 0, result.output
    m = json.loads(result.stdout)
    assert m["accumulation_steps"] == 3 and m["global_batch_tokens"] == 3072
    assert m["steps"] % 3 == 0 and m["optimizer_steps"] == m["steps"] // 3
    refused = CliRunner().invoke(main, [*args, "--global-batch-tokens", "3000", "--set", "token_budget=1024"])
    assert refused.exit_code == 2
    assert "--global-batch-tokens: token_budget: 1024 does not divide the global batch of 3000" in refused.stderr


def test_bench_refuses_cuda_graphs_with_accumulation_and_with_padded_batches_as_the_space_does():
    """The rules are the registry's: a compile mode that replays CUDA graphs neither accumulates
    (run_rule) nor takes padded batches, one graph per width (requires); the space agrees."""
    from autotune.config import TrainConfig
    from autotune.space.file import default_space_path, load_space

    args = ["bench", "--model", "gpt2-tiny", "--device", "cpu", "--steps", "2"]
    packed = ["--set", "batching=packed", "--set", "token_budget=1024"]
    refused = CliRunner().invoke(
        main, [*args, *packed, "--set", "compile_mode=max-autotune", "--global-batch-tokens", "4096"]
    )
    assert refused.exit_code == 2 and refused.stderr.count("\n") == 1
    assert refused.stderr.startswith("Error: --global-batch-tokens: compile_mode: max-autotune replays CUDA graphs")
    padded = CliRunner().invoke(main, [*args, "--set", "compile_mode=reduce-overhead"])  # batching: padded
    assert padded.exit_code == 2 and padded.stderr.count("\n") == 1
    assert "compile_mode=reduce-overhead replays CUDA graphs, recorded for one batch shape each" in padded.stderr
    space = load_space(default_space_path("cuda"), n_layer=12, seq_len=1024)
    graphs = TrainConfig(amp_dtype="bfloat16", batching="packed", compile_mode="reduce-overhead")
    assert space.violation(graphs) is None
    with pytest.raises(UsageError):
        graphs.replace(batching="padded")


@pytest.mark.slow
def test_search_prunes_cuda_graphs_with_accumulation_without_a_process(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    space = tmp_path / "graphs.yaml"
    space.write_text(
        "version: 1\nfixed: {batching: packed}\ndimensions:\n  token_budget: {choices: [1024]}\n"
        "  compile_mode: {choices: [none, max-autotune]}\n"
    )
    calls: list = []
    fake_trials(monkeypatch, calls=calls)
    args = [*FAST, "--space", str(space), "--global-batch-tokens", "2048", "--no-references"]
    result = CliRunner().invoke(main, ["search", *args, "--n-trials", "2"])
    assert result.exit_code == 0, result.output
    assert calls and all(cfg.compile_mode == "none" for _, cfg in calls)  # never proposed
    load_study(STUDY, None).enqueue_trial({"token_budget": 1024, "compile_mode": "max-autotune"})
    assert CliRunner().invoke(main, ["search", *args, "--n-trials", "1"]).exit_code == 0
    pruned = [t for t in load_study(STUDY, None).trials if t.params.get("compile_mode") == "max-autotune"][-1]
    assert all(cfg.compile_mode == "none" for _, cfg in calls)  # no process for it
    assert pruned.state == optuna.trial.TrialState.PRUNED and pruned.user_attrs["outcome"] == outcomes.UNSUPPORTED
    assert pruned.user_attrs["reason"].startswith("compile_mode: max-autotune replays CUDA graphs")


@pytest.mark.parametrize("value", ["0", "-5", "lots"])
def test_a_global_batch_must_be_a_positive_whole_number(value):
    result = CliRunner().invoke(main, ["search", *FAST, "--global-batch-tokens", value])
    assert result.exit_code == 2 and "Error: --global-batch-tokens: expected a whole number from 1 to" in result.stderr


@pytest.mark.process
def test_a_trial_process_measures_at_the_global_batch():
    """The spec crosses into the trial process with its global batch (search and verify run there)."""
    from autotune.config import TrainConfig
    from autotune.trial.runner import run_trial
    from tests.helpers import tiny_spec

    result = run_trial(
        tiny_spec(steps=2, global_batch_tokens=2048), TrainConfig(token_budget=1024, batching="packed"), timeout_s=120
    )
    assert result.outcome == outcomes.OK, result.reason
    m = result.measurement
    assert (m.accumulation_steps, m.global_batch_tokens, m.optimizer_steps * 2) == (2, 2048, m.steps)
