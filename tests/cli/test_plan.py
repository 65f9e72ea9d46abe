"""`autotune plan`: answers for every model size and card in seconds, without torch; refuses in one
line (exit 2); and a budget it says fits this CPU runs within the limit when really run."""

from __future__ import annotations

import json
import re
import time

import pytest

from autotune.device.flops import CARDS
from autotune.model.sizes import MODEL_SIZES
from tests.helpers import invoke, recorded_imports, recording_imports, run_autotune

GiB = 2**30


@pytest.mark.slow
@pytest.mark.parametrize("card", sorted(CARDS))
def test_it_answers_for_every_model_size_on_every_card_in_under_10_seconds(card):
    for model in MODEL_SIZES:
        start = time.monotonic()
        result = invoke("plan", "--model", model, "--gpu", card, "--trials", "0", "--json")
        took = time.monotonic() - start
        assert result.exit_code == 0, result.output
        answer = json.loads(result.stdout)
        assert answer["model"] == model and answer["device"]["card"] == card
        assert answer["families"] and answer["ceiling"]["tokens_per_sec"] > 0
        assert took < 10, f"{model} on {card}: {took:.1f} s"


SMALL_SPACE = """
version: 1
description: a few kernels and budgets, listed whole by the planner (no sample of 60,000)
dimensions:
  token_budget: {choices: [8192, 32768]}
  amp_dtype: {choices: [float32, bfloat16]}
  sdpa_backend: {choices: [math, flash]}
rules:
  - when: {sdpa_backend: flash}
    require: {amp_dtype: bfloat16}
    reason: "flash needs bfloat16"
"""


@pytest.mark.slow
def test_its_text_lists_the_first_trials_of_the_users_space_one_per_line(tmp_path):
    """--space is the search's: the first trials come from it. Each is a line of its own with its
    predicted peak and reason (they were printed as a Python list)."""
    (tmp_path / "space.yaml").write_text(SMALL_SPACE)
    result = invoke(
        "plan", "--model", "gpt2", "--gpu", "h100-80gb", "--space", str(tmp_path / "space.yaml"), "--trials", "2"
    )
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    firsts = [i for i, line in enumerate(lines) if line.startswith(("  1. ", "  2. "))]
    assert len(firsts) == 2 and not any(line.startswith("[") for line in lines)
    for i in firsts:
        assert re.search(r" budget=(8192|32768) ", lines[i]), lines[i]  # the space's budgets, not the GPU space's
        assert lines[i + 1].lstrip().startswith("predicted peak ")


def test_its_text_says_it_is_a_model_with_the_band_it_was_validated_to():
    result = invoke("plan", "--model", "gpt2-medium", "--gpu", "a100-40gb", "--trials", "0")
    assert result.exit_code == 0, result.output
    text = result.stdout.lower()
    assert "a model, not a measurement" in text and "docs/plan.md" in text
    assert "upper bound" in text and "nvidia a100-sxm4-40gb" in text


@pytest.mark.parametrize(
    "args, says",
    [
        (["--model", "gpt2", "--gpu", "h300"], "unknown card 'h300'"),
        (["--model", "gpt5", "--gpu", "h100-80gb"], "unknown model 'gpt5'"),
        (["--model", "gpt2", "--gpu", "t4", "--study", "s"], "--study"),
        (["--model", "gpt2", "--gpu", "t4", "--seq-len", "4096"], "--seq-len 4096"),
    ],
)
def test_a_refusal_is_one_line_and_exit_2(args, says):
    result = invoke("plan", *args)
    assert result.exit_code == 2
    assert result.stdout == "" and len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.startswith("Error: ") and says in result.stderr


@pytest.mark.process
def test_a_model_that_cannot_be_built_is_one_line_and_nothing_of_torch_in_the_planning_process(tmp_path):
    env = recording_imports(tmp_path / "imports")
    ok = run_autotune("plan", "--model", "gpt2-xl", "--gpu", "h200", "--trials", "0", cwd=tmp_path, env=env)
    assert ok.returncode == 0, ok.stderr
    planners = [r for r in recorded_imports(tmp_path / "imports") if "plan" in r["argv"]]
    assert planners and not any(r["torch"] for r in planners)
    bad = run_autotune("plan", "--model", "tests.fixture_models:no_such_factory", "--gpu", "l4", cwd=tmp_path)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    assert "no_such_factory" in bad.stderr


@pytest.mark.slow
def test_the_budget_it_says_fits_this_cpu_runs_within_the_limit(tmp_path):
    """gpt2-tiny under a 700 MiB limit: the largest budget the plan gives its heaviest family
    (float32, math attention, the standard loss, nothing checkpointed) within the error it was
    validated to, run for real with bench."""
    limit = "700MiB"
    planned = run_autotune(
        "plan",
        "--model",
        "gpt2-tiny",
        "--gpu",
        "current",
        "--memory-limit",
        limit,
        "--trials",
        "0",
        "--json",
        cwd=tmp_path,
    )
    assert planned.returncode == 0, planned.stderr
    answer = json.loads(planned.stdout)
    knobs = {"amp_dtype": "float32", "sdpa_backend": "math", "loss_impl": "standard"}
    (family,) = [
        f for f in answer["families"] if f["checkpointed"] == 0 and all(f["config"][k] == v for k, v in knobs.items())
    ]
    budget = family["largest_budget"]["within_error"]
    assert budget and budget >= 8 * answer["seq_len"]
    sets = [a for k, v in {**knobs, "token_budget": budget}.items() for a in ("--set", f"{k}={v}")]
    ran = run_autotune(
        "bench",
        "--model",
        "gpt2-tiny",
        "--device",
        "cpu",
        "--memory-limit",
        limit,
        "--warmup",
        "1",
        "--steps",
        "2",
        "--min-time",
        "0",
        "--json",
        *sets,
        cwd=tmp_path,
    )
    measured = json.loads(ran.stdout)
    assert measured["outcome"] == "ok", ran.stderr
    assert measured["peak_memory_bytes"] <= answer["feasible_bytes"]
