"""autotune.recipe.verify and `autotune verify`: a recipe measured here passes within a generous
tolerance and fails when its record is out of reach; the tolerance's default and errors. The
CPU is shared and noisy: the failing recipe claims far more than any run could reach."""

from __future__ import annotations

import json

import pytest

from autotune.errors import UsageError
from autotune.recipe.recipe import Recipe
from autotune.units import parse_fraction
from tests.helpers import FAST, cpu_recipe, invoke, save_recipe


@pytest.mark.process  # verify measures in a trial process
def test_verify_passes_within_a_generous_tolerance(recipe, tmp_path):
    elsewhere = Recipe.from_dict(recipe.to_dict())
    elsewhere.hardware["name"] = "Imaginary CPU 9000"
    path = elsewhere.save(tmp_path / "r.json")
    result = invoke("verify", str(path), "--tolerance", "99%", *FAST)
    assert result.exit_code == 0, result.output
    assert "PASS" in result.stdout
    assert "tokens/s" in result.stdout and "peak memory" in result.stdout and "ratio" in result.stdout
    # Measured on other hardware: one line on stderr, not a Python warning's two.
    warning_lines = result.stderr.strip().splitlines()
    assert len(warning_lines) == 1 and warning_lines[0].startswith("Warning: this recipe was measured elsewhere")
    assert "Imaginary CPU 9000" in warning_lines[0]


@pytest.mark.process  # verify measures in a trial process
def test_verify_fails_when_the_record_is_out_of_reach(recipe, tmp_path):
    # 1000x, not 10x: a run on this shared CPU can be 10x slower or faster than another.
    path = save_recipe(recipe, tmp_path / "r.json", tokens_per_sec=1000 * recipe.measured["tokens_per_sec"])
    result = invoke("verify", str(path), "--json", *FAST)
    assert result.exit_code == 1, result.output
    assert "measured elsewhere" not in result.stderr  # measured here
    data = json.loads(result.stdout)
    assert set(data) == {
        "recorded",
        "measured",
        "ratio_tokens_per_sec",
        "ratio_peak_memory",
        "tolerance",
        "passed",
        "outcome",
        "reason",
    }
    assert data["passed"] is False and data["outcome"] == "ok"
    assert data["tolerance"] == pytest.approx(0.15)  # the CPU default: its runs spread more than a GPU's
    assert "below the 0.85x allowed" in data["reason"]
    assert data["ratio_tokens_per_sec"] == pytest.approx(
        data["measured"]["tokens_per_sec"] / data["recorded"]["tokens_per_sec"]
    )
    assert data["ratio_peak_memory"] > 0 and data["measured"]["peak_memory_bytes"] > 0


def test_default_tolerance_is_tighter_on_a_gpu():
    from autotune.recipe.verify import default_tolerance

    assert default_tolerance("cuda") == default_tolerance("cuda:1") == pytest.approx(0.05)
    assert default_tolerance("cpu") == pytest.approx(0.15)


@pytest.mark.parametrize("bad", ["abc", "150%", "1.5", "-5%"])
def test_bad_tolerance_exits_2_naming_the_option(recipe, tmp_path, bad):
    with pytest.raises(UsageError):
        parse_fraction(bad, option="--tolerance")
    result = invoke("verify", str(save_recipe(recipe, tmp_path / "r.json")), "--tolerance", bad)
    assert result.exit_code == 2
    assert "--tolerance" in result.output


def test_verify_builds_only_a_users_code_in_a_child_first(monkeypatch, tmp_path):
    """As bench: a user's factory or config directory is probed first; autotune's own models
    (an `hf:` one too) are only named, and the trial builds them."""
    import autotune.trial.probe
    from autotune.recipe.verify import recipe_run_spec

    probed = []
    shape = autotune.trial.probe.ProbedModel(vocab_size=320, context_length=128, n_layer=2)
    monkeypatch.setattr(autotune.trial.probe, "probe", lambda model, **kw: probed.append(model) or shape)
    (tmp_path / "config.json").write_text("{}")
    users = ["tests.fixture_models:make_llama", f"hf:{tmp_path}"]
    for model in ["gpt2-tiny", "hf:gpt2-tiny", *users]:
        spec = recipe_run_spec(  # --model naming the recipe's own model (verify refuses another)
            cpu_recipe(model={"name": model, "seq_len": 64, "n_layer": 2, "vocab_size": 320}),
            device="cpu",
            data=None,
            warmup=1,
            steps=2,
            min_time_s=0.0,
            timeout_s=60,
            model=model,
            allow_model_import=False,
        )
        assert spec.model == model
    assert probed == users


@pytest.mark.parametrize("soak", [False, True], ids=["verify", "soak"])
def test_verify_with_another_model_than_the_recipes_is_refused_before_anything_runs(tmp_path, monkeypatch, soak):
    """`verify --model gpt2-small` of a gpt2-tiny recipe (issue D, #13) would judge gpt2-small's
    measurement against gpt2-tiny's recorded figure, and print PASS or FAIL of nothing."""
    import autotune.recipe.soak_check
    import autotune.recipe.verify

    def no_run(*args, **kwargs):
        raise AssertionError("nothing runs on a refusal")

    monkeypatch.setattr(autotune.recipe.verify, "run_trial", no_run)
    monkeypatch.setattr(autotune.recipe.verify, "check_recipe_runs", no_run)
    monkeypatch.setattr(autotune.recipe.soak_check, "run_soak", no_run)
    path = save_recipe(cpu_recipe(token_budget=1024), tmp_path / "r.json")
    result = invoke("verify", str(path), "--model", "gpt2-small", *(["--soak"] if soak else []), *FAST)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("Error: ") and "'gpt2-small'" in lines[0] and "'gpt2-tiny'" in lines[0]
    assert "drop --model" in lines[0]

    # --model naming the recipe's own model (as a recipe naming a user's factory asks) is taken.
    class Reached(Exception):
        pass

    def reached(*args, **kwargs):
        raise Reached

    monkeypatch.setattr(autotune.recipe.verify, "check_recipe_runs", lambda *a, **k: None)
    monkeypatch.setattr(autotune.recipe.verify, "run_trial", reached)
    monkeypatch.setattr(autotune.recipe.soak_check, "run_soak", reached)
    with pytest.raises(Reached):
        invoke("verify", str(path), "--model", "gpt2-tiny", *(["--soak"] if soak else []), *FAST)
