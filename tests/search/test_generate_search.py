"""`search --task generate` through the study machinery, its trial processes replaced by a
model of them (each configuration's figures a function of its knobs): the references open the
study, every trial carries its constraints (memory, recompiles, the latency bounds) as Optuna
constraints, a diverged or recompiled configuration is never the best, the recipe is a
generation recipe; options of the other task are refused in one line."""

from __future__ import annotations

import json

import optuna
import pytest
from click.testing import CliRunner

from autotune.cli import main
from autotune.config import GenerateConfig
from autotune.errors import UsageError
from autotune.measure import outcomes
from autotune.measure.measurement import Measurement
from autotune.recipe import Recipe
from autotune.search import generate as search_generate
from autotune.search.run import run_search
from autotune.search.settings import SearchSettings
from autotune.study.record import read_trials
from autotune.trial.runner import TrialResult

GiB = 1 << 30


def modelled_trial(spec, cfg: GenerateConfig, *, timeout_s, device=None, on_start=None) -> TrialResult:
    """A generation trial's result as a function of its knobs: throughput grows with the batch and
    doubles with a static cache, the p99 time per token grows with the batch; float16 leaves the
    reference's tokens, max-autotune-no-cudagraphs recompiles while timed."""
    rate = 100.0 * cfg.batch_size * (2 if cfg.kv_cache == "static" else 1)
    outcome, reason, recompiles = outcomes.OK, None, 0
    if cfg.dtype == "float16":
        outcome, reason = outcomes.DIVERGED, "greedy tokens leave the eager float32 reference at token 1"
    elif cfg.decode_compile == "max-autotune-no-cudagraphs":
        outcome, reason, recompiles = outcomes.RECOMPILED, "1 compile event(s) while the generations were timed", 1
    figures = {"token_latency_p99_s": 0.001 * cfg.batch_size, "ttft_p99_s": 0.002, "output_tokens_per_sec": rate}
    m = Measurement(
        config=cfg.to_dict(),
        outcome=outcome,
        reason=reason,
        tokens_per_sec=rate,
        peak_memory_bytes=100 << 20,
        recompiles_during_timing=recompiles,
        generation=figures,
    )
    return TrialResult(outcome, reason, m)


@pytest.fixture
def modelled(monkeypatch):
    monkeypatch.setattr(search_generate, "run_generation_trial", modelled_trial)


def settings(tmp_path, **changes) -> SearchSettings:
    values = {
        "task": "generate",
        "model": "gpt2-tiny",
        "device": "cpu",
        "prompt_len": 8,
        "new_tokens": 4,
        "storage": f"journal:{tmp_path / 'g.journal'}",
        "recipe": str(tmp_path / "g.json"),
        "memory_limit_bytes": GiB,
        "n_trials": 14,
        "seed": 3,
    }
    return SearchSettings(**{**values, **changes})


def test_references_first_constraints_on_every_trial_and_only_a_feasible_one_is_best(tmp_path, modelled):
    result = run_search(settings(tmp_path, max_p99_token_latency_s=0.0025))
    records = read_trials(result.study)
    baseline, cure = records[0], records[1]
    assert (baseline.reference, cure.reference) == ("baseline", "checklist")
    assert baseline.config == GenerateConfig().to_dict()
    assert (cure.config["kv_cache"], cure.config["decode_compile"], cure.config["batch_size"]) == (
        "static",
        "default",
        1,
    )
    sampled = [r.proposed_by for r in records[2:]]
    assert sampled and set(sampled) <= {"kernels", "batch_and_prompt_bucket", "measured_again"}  # the planner's stages
    measured = [r for r in records if r.measurement is not None and r.outcome in outcomes.MEASURED]
    assert measured and all({"memory", "recompiles", "p99_token_latency"} <= set(r.constraints) for r in measured)
    best = result.summary.best
    assert best.feasible and best.config["batch_size"] <= 2  # the bound: 1 ms a sequence of the batch
    assert best.config["dtype"] != "float16" and best.config["decode_compile"] != "max-autotune-no-cudagraphs"
    for r in records:
        if r.outcome in (outcomes.DIVERGED, outcomes.RECOMPILED) or r.constraints.get("p99_token_latency", 0) > 0:
            assert not r.feasible
    assert result.summary.speedup(result.summary.baseline) is not None
    recipe = Recipe.load(result.recipe_path, check_environment=False)
    assert recipe.task == "generate" and recipe.config.to_dict() == best.config
    assert recipe.workload["new_tokens"] == 4 and recipe.workload["prompt_lens"] == [8]
    assert recipe.reference_speedups["baseline"] == pytest.approx(result.summary.speedup(result.summary.baseline))


def test_the_latency_objective_searches_batch_one_only(tmp_path, modelled):
    result = run_search(settings(tmp_path, objective="latency", n_trials=5, references=False))
    assert {r.config["batch_size"] for r in read_trials(result.study)} == {1}
    assert "batch_size" not in result.task.space.choices


def test_fixed_knobs_are_held_and_the_references_keep_theirs(tmp_path, modelled):
    result = run_search(settings(tmp_path, fix="decode_compile=none,dtype=float32", n_trials=6))
    sampled = [r for r in read_trials(result.study) if r.reference is None]
    assert {(r.config["decode_compile"], r.config["dtype"]) for r in sampled} == {("none", "float32")}
    assert read_trials(result.study)[1].config["decode_compile"] == "default"  # the cure compiles


def test_resuming_with_another_latency_bound_is_refused_and_without_one_keeps_the_studys(tmp_path, modelled):
    run_search(settings(tmp_path, n_trials=2, max_ttft_s=0.5, confirm=False))
    with pytest.raises(Exception, match="--max-ttft 0.5, this run 0.2"):
        run_search(settings(tmp_path, n_trials=1, max_ttft_s=0.2))
    resumed = run_search(settings(tmp_path, n_trials=1, confirm=False))
    assert resumed.task.max_ttft_s == 0.5


def test_when_no_trial_meets_a_latency_bound_the_verdict_and_each_trial_say_so(tmp_path, modelled):
    """Issue D, G12: with no trial within --max-ttft every trial showed `ok` and the verdict was "no
    trial fits the memory limit" (at a peak of a tenth of it). The verdict (the search's, `show`'s,
    the report's) names the bound nothing met, and each trial over it says so where its outcome is
    shown (its line, the counts)."""
    from autotune.present.importance import knob_importance
    from autotune.present.report import report_sections
    from autotune.present.summaries import search_summary, trial_line

    result = run_search(settings(tmp_path, n_trials=3, max_ttft_s=0.001, confirm=False))
    summary = result.summary  # every trial's p99 TTFT is 2 ms: twice the bound
    assert summary.best is None and result.recipe_path is None
    verdict = summary.no_best_reason
    assert "--max-ttft" in verdict and "memory" not in verdict, verdict
    assert verdict in search_summary(result)
    best = next(s for s in report_sections(result.study, summary, knob_importance(result.study)) if "Best" in s.title)
    assert best.note == verdict
    over = [t for t in summary.trials if t.outcome is outcomes.OK]
    assert over and summary.counts.get("ok") is None, summary.counts
    for t in over:
        assert t.broken_bounds == ["--max-ttft"] and not t.feasible
        line = trial_line(t)
        assert " ok " not in line and "above --max-ttft by 100%" in line, line


def run_cli(*args: str):
    return CliRunner().invoke(main, list(args))


@pytest.mark.parametrize(
    "args, message",
    [
        (["--task", "generate", "--data", "x.bin"], "--data is an option of --task train"),
        (["--prompt-len", "8"], "--prompt-len is an option of --task generate"),
        (["--objective", "latency"], "--objective latency is not one of --task train"),
        (["--task", "generate", "--objective", "tokens_per_joule"], "is not one of --task generate"),
        (["--task", "generate", "--batch", "8-2"], "--batch: cannot read '8-2'"),
        (["--task", "generate", "--fix", "amp_dtype=float32"], "unknown knob 'amp_dtype'"),
        (["--task", "generate", "--prompt-len", "120", "--new-tokens", "16"], "do not fit the context"),
        (["--task", "generate", "--model", "tests.fixture_models:make_llama"], "generation is measured on"),
        (["--task", "generate", "--objective", "latency", "--batch", "4"], "leave --batch out"),
    ],
)
def test_bad_generation_options_are_one_line_and_exit_2(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    result = run_cli("search", "--model", "gpt2-tiny", "--device", "cpu", *args)
    assert result.exit_code == 2, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "studies").exists()


def test_a_prompts_file_gives_its_length_distribution(tmp_path):
    from autotune.data.prompts import prompt_lengths

    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text("\n".join(json.dumps({"prompt": "x" * n}) for n in (3, 10, 20)) + "\n")
    assert prompt_lengths(jsonl, vocab_size=320) == (3, 10, 20)  # byte-level: a byte a token
    text = tmp_path / "p.txt"
    text.write_text("one prompt\n\nanother, longer prompt\n")
    assert prompt_lengths(text, vocab_size=320) == (10, 22)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": 1}\n')
    with pytest.raises(UsageError, match='line 1 has no "prompt" or "text" string'):
        prompt_lengths(bad, vocab_size=320)
    with pytest.raises(UsageError, match="no prompts in it"):
        prompt_lengths(_empty(tmp_path), vocab_size=320)


def _empty(tmp_path):
    path = tmp_path / "empty.txt"
    path.write_text("\n\n")
    return path


def test_a_generation_and_a_training_study_of_one_model_are_separate(tmp_path, monkeypatch, modelled):
    from autotune.search.preflight import preflight
    from autotune.study.storage import open_storage

    monkeypatch.chdir(tmp_path)
    generation = preflight(settings(tmp_path, storage=None, recipe=None))
    assert (generation.name, generation.url) == (
        "gpt2-tiny-generate-cpu",
        "sqlite:///studies/gpt2-tiny-generate-cpu.db",
    )
    assert preflight(SearchSettings(model="gpt2-tiny", device="cpu")).name == "gpt2-tiny-cpu"
    journal = f"journal:{tmp_path / 'g.journal'}"
    run_search(settings(tmp_path, n_trials=1, study="shared", storage=journal, confirm=False))
    study = optuna.load_study(study_name="shared", storage=open_storage(journal))
    assert study.user_attrs["task"] == "generate" and study.user_attrs["identity"]["task"] == "generate"
    with pytest.raises(Exception, match="was made for task generate, this run is task train"):
        run_search(SearchSettings(model="gpt2-tiny", device="cpu", study="shared", storage=journal, n_trials=1))


def test_show_and_report_give_the_throughput_latency_front(tmp_path, modelled):
    from autotune.present.generation import front
    from autotune.present.importance import knob_importance
    from autotune.present.report import report_sections
    from autotune.present.summaries import show_json, show_text
    from autotune.study.summary import summarize

    study = run_search(settings(tmp_path, n_trials=8, confirm=False)).study
    summary = summarize(study)
    points = front(summary.trials)
    # No point of the front is beaten on both figures by a feasible trial.
    assert points and all(
        not (q.tokens_per_sec > p.tokens_per_sec and q.token_p99_s < p.token_p99_s) for p in points for q in points
    )
    assert "throughput/latency front" in show_text(study, summary, 20)
    assert [row["trial"] for row in show_json(study, summary)["front"]] == [p.trial.number for p in points]
    section = next(s for s in report_sections(study, summary, knob_importance(study)) if "front" in s.title)
    assert [row[0] for row in section.rows] == [f"#{p.trial.number}" for p in points]
