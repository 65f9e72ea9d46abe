"""Every numeric option of the command line is bounded (issue E): `verify --soak --steps -3` ran
"-3 steps" and printed PASS, `--steps 99999999999` and `--steps 0` were accepted, a negative
`--limit` or `--seed` went through. A value out of range is one line naming the option and the
range, exit 2, before any work starts."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from autotune.cli import main
from tests.helpers import cpu_recipe, save_recipe


def no_work(*args, **kwargs):
    raise AssertionError("a refused command must not start any work")


@pytest.fixture
def nothing_runs(monkeypatch):
    for target in (
        "autotune.measure.loop.measure",
        "autotune.recipe.verify.run_trial",
        "autotune.recipe.soak_check.run_soak",
        "autotune.recipe.profile.profile_config",
        "autotune.search.run.run_search",
        "autotune.study.storage.load_study",
    ):
        monkeypatch.setattr(target, no_work)


CASES = [
    (["verify", "R", "--soak", "--steps", "-3"], "--steps: expected a whole number from 2 to 1000000, got '-3'"),
    (["verify", "R", "--soak", "--steps", "0"], "--steps: expected a whole number from 2 to 1000000, got '0'"),
    (["verify", "R", "--soak", "--steps", "99999999999"], "--steps: expected a whole number from 2 to 1000000"),
    (["verify", "R", "--steps", "1"], "--steps: expected a whole number from 2 to 1000000, got '1'"),
    (["verify", "R", "--warmup", "-1"], "--warmup: expected a whole number from 0 to 1000000, got '-1'"),
    (["verify", "R", "--min-time", "-1"], "--min-time: expected a number from 0 to 3600, got '-1'"),
    (["verify", "R", "--min-time", "nan"], "--min-time: expected a number from 0 to 3600, got 'nan'"),
    (["verify", "R", "--tolerance", "2"], "--tolerance: '2' is not between 0 and 100%"),
    (["profile", "R", "--steps", "0"], "--steps: expected a whole number from 1 to 1000000, got '0'"),
    (["bench", "--device", "cpu", "--seq-len", "0"], "--seq-len: expected a whole number from 2 to 1048576"),
    (["bench", "--device", "cpu", "--seq-len", "1" + "0" * 5000], "--seq-len: expected a whole number from 2 to"),
    (["bench", "--device", "cpu", "--seed", "-1"], "--seed: expected a whole number from 0 to 4294967295, got '-1'"),
    (["bench", "--device", "cpu", "--min-time", "1e9"], "--min-time: expected a number from 0 to 3600, got '1e9'"),
    (["bench", "--device", "cpu", "--global-batch-tokens", "0"], "--global-batch-tokens: expected a whole number"),
    (["show", "--study", "x", "--limit", "-1"], "--limit: expected a whole number from 1 to 1000000, got '-1'"),
    (["show", "--study", "x", "--limit", "0"], "--limit: expected a whole number from 1 to 1000000, got '0'"),
    (["search", "--n-trials", "0"], "--n-trials: expected a whole number from 1 to 1000000, got '0'"),
    (["search", "--steps", "99999999999"], "--steps: expected a whole number from 2 to 1000000"),
    (["search", "--memory-fraction", "2"], "--memory-fraction: expected a number above 0 and at most 1, got '2'"),
    (["dashboard", "--study", "x", "--port", "70000"], "--port: expected a whole number from 1 to 65535, got '70000'"),
]


@pytest.mark.parametrize("args, said", CASES, ids=[" ".join(a)[:60] for a, _ in CASES])
def test_a_numeric_option_out_of_range_is_one_line_and_exit_2(tmp_path, monkeypatch, nothing_runs, args, said):
    monkeypatch.chdir(tmp_path)
    recipe = str(save_recipe(cpu_recipe(), tmp_path / "r.json"))
    result = CliRunner().invoke(main, [recipe if a == "R" else a for a in args])
    assert result.exit_code == 2, (result.output, result.exception)
    assert result.stderr.startswith("Error: ") and result.stderr.count("\n") == 1, result.stderr
    assert said in result.stderr, result.stderr


def test_numbers_in_range_are_taken(tmp_path, monkeypatch):
    """The bounds refuse nothing that was valid: the values reach the command as numbers."""
    import optuna

    from autotune.study.storage import open_storage

    seen = {}

    def record(loaded, summary, limit):
        seen["limit"] = limit
        return "listed"

    url = f"journal:{tmp_path / 's.journal'}"
    optuna.create_study(study_name="x", storage=open_storage(url), direction="maximize")
    monkeypatch.setattr("autotune.present.summaries.show_text", record)
    result = CliRunner().invoke(main, ["show", "--storage", url, "--study", "x", "--limit", "+7"])
    assert result.exit_code == 0 and seen == {"limit": 7}, result.output


@pytest.mark.parametrize("steps", [-3, 0, 1, 99999999999, True])
def test_soak_recipe_refuses_a_step_count_out_of_range(monkeypatch, nothing_runs, steps):
    """The library too: soak_recipe(steps=-3) ran a soak of "-3 steps" and passed."""
    from autotune.errors import UsageError
    from autotune.recipe.soak_check import soak_recipe

    with pytest.raises(UsageError, match="steps must be an integer"):
        soak_recipe(cpu_recipe(), device="cpu", steps=steps, warmup=1, timeout_s=60)
