"""A recipe is data, never code, and never a way to exhaust the machine (issue 14, items 5 and
14): a `package.module:factory` model is not imported without the user's say; knob values are
bounded (10,000 workers are refused before any process starts); anchor bombs, oversized and
non-UTF-8 files, and fields of the wrong type are one line, exit 2, with nothing run or written."""

from __future__ import annotations

import json

import pytest

from autotune.config import TrainConfig
from autotune.errors import UsageError
from autotune.recipe.recipe import Recipe
from tests.attack_helpers import files_under, refused


def recipe_dict(**changes) -> dict:
    recipe = Recipe(
        config=TrainConfig(),
        model={"name": "gpt2-tiny", "seq_len": 128, "n_layer": 2, "vocab_size": 320},
        measured={"tokens_per_sec": 1000.0, "peak_memory_bytes": 300 << 20, "memory_limit_bytes": None},
        study={"name": "s", "storage": "sqlite:///x.db", "trial": 1},
        created="2026-11-29T00:00:00+00:00",
    ).to_dict()
    for key, value in changes.items():
        section, _, field = key.partition("__")
        if field:
            recipe[section][field] = value
        else:
            recipe[section] = value
    return recipe


def write(tmp_path, raw, name="r.json"):
    path = tmp_path / name
    path.write_text(raw if isinstance(raw, str) else json.dumps(raw))
    return path


@pytest.fixture
def no_run(monkeypatch):
    def run_trial(*args, **kwargs):
        raise AssertionError("nothing may run for a refused recipe")

    monkeypatch.setattr("autotune.recipe.verify.run_trial", run_trial)


def test_a_recipe_model_is_not_imported_without_the_users_say(tmp_path, monkeypatch, no_run):
    """The attacker's reproduction: `evilmod.py` in the current folder, named by the recipe."""
    marker = tmp_path / "pwned"
    (tmp_path / "evilmod.py").write_text(
        f"open({str(marker)!r}, 'w').write('imported')\ndef factory():\n    open({str(marker)!r}, 'w').write('ran')\n"
    )
    path = write(tmp_path, recipe_dict(model__name="evilmod:factory"))
    for command in (["verify"], ["profile"]):
        message = refused(tmp_path, monkeypatch, *command, str(path), "--device", "cpu")
        assert "would import and run code from 'evilmod'" in message and "--allow-model-import" in message
        assert not marker.exists()


def test_the_model_to_run_is_the_users_choice():
    recipe = Recipe.from_dict(recipe_dict(model__name="evilmod:factory"))
    with pytest.raises(UsageError, match="--model evilmod:factory"):
        recipe.model_to_run()
    assert recipe.model_to_run(allow_import=True) == "evilmod:factory"
    assert recipe.model_to_run("gpt2-tiny") == "gpt2-tiny"
    assert Recipe.from_dict(recipe_dict()).model_to_run() == "gpt2-tiny"  # ours: nothing to allow
    # A Hugging Face model is built from a config (ours, or a local directory's config.json,
    # without remote code): no module is imported, so nothing to allow either. A search of
    # `--model hf:gpt2` wrote recipes that verify and profile refused as code "from 'hf'".
    for name in ("hf:gpt2-tiny", "hf:/models/my-llama"):
        assert Recipe.from_dict(recipe_dict(model__name=name)).model_to_run() == name


def test_ten_thousand_workers_are_refused_before_any_process(tmp_path, monkeypatch, no_run):
    path = write(tmp_path, recipe_dict(config__num_workers=10000))
    assert "num_workers must be an integer <= 1024" in refused(tmp_path, monkeypatch, "verify", str(path))
    many = write(tmp_path, recipe_dict(config__num_workers=100), "many.json")
    message = refused(tmp_path, monkeypatch, "verify", str(many), "--device", "cpu")
    assert "num_workers 100 is more than" in message and "AUTOTUNE_MAX_NUM_WORKERS" in message


def test_an_anchor_bomb_recipe_is_refused_at_once(tmp_path, monkeypatch):
    lines = ["format: autotune.recipe", "version: 1", "config: {}", "a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}]" for i in range(1, 30)]
    path = write(tmp_path, "\n".join(lines) + "\n", "bomb.yaml")
    composed = count_composed_nodes(monkeypatch)
    message = refused(tmp_path, monkeypatch, "export", str(path), "--format", "hf")
    # Refused at the first anchor, before anything expands: a handful of nodes, not 10 x 5^29.
    assert "anchors and aliases" in message and 0 < composed[0] < 20


BAD = {
    "checkpoint_layers_int": (
        recipe_dict(config__checkpoint_layers=5),
        "config: checkpoint_layers must be a list of block indices, got 5",
    ),
    "memory_limit_text": (
        recipe_dict(measured__memory_limit_bytes="abc"),
        "measured.memory_limit_bytes: expected a whole number >= 0 or null, got 'abc'",
    ),
    "memory_limit_one_byte": (
        recipe_dict(measured__memory_limit_bytes=1),
        "measured.memory_limit_bytes: 1 is 1 B; a memory limit is at least 1 MiB",
    ),
    "tokens_per_sec_text": (recipe_dict(measured__tokens_per_sec="fast"), "measured.tokens_per_sec: expected a number"),
    "model_name_number": (recipe_dict(model__name=5), "model.name: expected a model name on one line"),
    "data_list": (recipe_dict(data=["a"]), "data must be text"),
    "bool_workers": (recipe_dict(config__num_workers=True), "num_workers must be an integer >= 0, got True"),
    "huge_budget": (recipe_dict(config__token_budget=10**15), "token_budget must be an integer <= 1073741824"),
}


@pytest.mark.parametrize("case", sorted(BAD))
@pytest.mark.parametrize("command", ["verify", "export"])
def test_wrong_types_are_one_line(tmp_path, monkeypatch, no_run, case, command):
    raw, message = BAD[case]
    path = write(tmp_path, raw)
    said = refused(tmp_path, monkeypatch, command, str(path), *(["--device", "cpu"] if command == "verify" else []))
    assert said.startswith(f"Error: recipe {path}: ") and message in said, said


def test_non_utf8_oversized_and_special_files_are_one_line(tmp_path, monkeypatch):
    latin = tmp_path / "latin.json"
    latin.write_bytes(
        json.dumps(recipe_dict(data="cafe"), ensure_ascii=False).replace("cafe", "caf\u00e9").encode("latin-1")
    )
    assert "not UTF-8 text" in refused(tmp_path, monkeypatch, "export", str(latin))
    big = write(tmp_path, json.dumps(recipe_dict(data="x" * (2 << 20))), "big.json")
    assert "larger than 1024 KiB" in refused(tmp_path, monkeypatch, "export", str(big))
    assert "not a regular file" in refused(tmp_path, monkeypatch, "export", "/dev/zero")


def test_a_recipe_whose_peak_is_above_its_own_limit_is_not_verified(tmp_path, monkeypatch, no_run):
    path = write(tmp_path, recipe_dict(measured__memory_limit_bytes=100 << 20))  # peak recorded: 300 MiB
    message = refused(tmp_path, monkeypatch, "verify", str(path), "--device", "cpu")
    assert "above its own memory limit" in message


def test_export_writes_atomically_and_refuses_a_folder(tmp_path, monkeypatch):
    path = write(tmp_path, recipe_dict())
    (tmp_path / "out").mkdir()
    assert "is a folder" in refused(tmp_path, monkeypatch, "export", str(path), "-o", "out", "--format", "hf")
    assert files_under(tmp_path) == {"r.json", "out"}


def count_composed_nodes(monkeypatch) -> list[int]:
    """How many YAML nodes the strict loader composes (a count, not a clock: "refused at once")."""
    from autotune.config import _StrictLoader

    count = [0]
    real = _StrictLoader.compose_node

    def counting(self, parent, index):
        count[0] += 1
        return real(self, parent, index)

    monkeypatch.setattr(_StrictLoader, "compose_node", counting)
    return count


# --- numbers and types, read back exactly (issue E) -------------------------------------------


@pytest.mark.parametrize("headroom", [0.00001, 1e-9, 0.05])
def test_a_recipe_autotune_wrote_reads_back_with_its_tiny_floats(tmp_path, headroom):
    """`--memory-headroom 0.00001` was written as 1e-05, which the YAML 1.1 loader read as text:
    the recipe autotune itself wrote could not be read back."""
    recipe = Recipe.from_dict(recipe_dict(measured__memory_headroom=headroom, measured__mfu=1e-7))
    path = recipe.save(tmp_path / "r.json")
    loaded = Recipe.load(path, check_environment=False)
    assert loaded.measured["memory_headroom"] == headroom and loaded.measured["mfu"] == 1e-7
    assert loaded == recipe


@pytest.mark.parametrize(
    "text, said",
    [
        ('{"format": "autotune.recipe", "version": 1, "version": 1}', "duplicate key 'version'"),
        (json.dumps(recipe_dict()).replace('"tokens_per_sec": 1000.0', '"tokens_per_sec": NaN'), "NaN"),
        (json.dumps(recipe_dict()).replace('"tokens_per_sec": 1000.0', '"tokens_per_sec": 1e400'), "1e400"),
    ],
    ids=["duplicate-key", "nan", "overflow"],
)
def test_a_json_recipe_is_read_as_strict_json(tmp_path, monkeypatch, text, said):
    message = refused(tmp_path, monkeypatch, "export", str(write(tmp_path, text)))
    assert "not a valid recipe file" in message and said in message, message


@pytest.mark.parametrize("name", ["r.json", "r.yaml"])
@pytest.mark.parametrize("where", ["config__token_budget", "measured__peak_memory_bytes", "version"])
def test_a_5000_digit_integer_in_a_recipe_is_one_line(tmp_path, monkeypatch, name, where):
    """Python's digit-limit ValueError came out as a traceback."""
    text = json.dumps(recipe_dict(**{where: 12345})).replace("12345", "9" * 5000)
    message = refused(tmp_path, monkeypatch, "export", str(write(tmp_path, text, name)))
    assert "integer" in message and "too large" in message and len(message) < 300, message


@pytest.mark.parametrize("version", [True, 1.0, "1"])
def test_a_recipe_version_must_be_a_true_integer(tmp_path, monkeypatch, version):
    """`version: true` was accepted: bool is an int in Python."""
    message = refused(tmp_path, monkeypatch, "export", str(write(tmp_path, recipe_dict(version=version))))
    assert "version must be a positive integer" in message, message


RUNS_NOWHERE = {
    "block_beyond_the_model": (
        recipe_dict(config__checkpoint_layers=[1, 99999]),
        "checkpoint_layers: block 99999 does not exist, gpt2-tiny has 2 blocks (0 to 1)",
    ),
    "seq_len_beyond_the_context": (
        recipe_dict(model__seq_len=10**12),
        "model.seq_len: 1000000000000 is longer than gpt2-tiny's context of 128 tokens",
    ),
    "seq_len_one": (recipe_dict(model__seq_len=1), "model.seq_len: must be at least 2, got 1"),
    "data_not_a_data_file": (
        recipe_dict(data="/etc/passwd"),
        "data '/etc/passwd': expected synthetic or a file ending in .bin, .txt or .jsonl",
    ),
}


@pytest.fixture
def no_run_at_all(monkeypatch, no_run):
    def nothing(*args, **kwargs):
        raise AssertionError("nothing may run for a recipe that cannot run")

    monkeypatch.setattr("autotune.recipe.soak_check.run_soak", nothing)
    monkeypatch.setattr("autotune.recipe.profile.profile_config", nothing)


@pytest.mark.parametrize("case", sorted(RUNS_NOWHERE))
@pytest.mark.parametrize("command", [["verify"], ["verify", "--soak"], ["profile"]], ids=" ".join)
def test_recipe_fields_that_load_but_cannot_run_are_bad_input(tmp_path, monkeypatch, no_run_at_all, case, command):
    """A checkpointed block 99999, seq_len 10**12 or data /etc/passwd started a trial, then failed
    verify with exit 1: bad input, exit 2, before any process starts."""
    raw, message = RUNS_NOWHERE[case]
    if command == ["profile"] and case == "data_not_a_data_file":
        pytest.skip("profile measures on --data (synthetic by default), never the recipe's data")
    path = write(tmp_path, raw)
    said = refused(tmp_path, monkeypatch, *command, str(path), "--device", "cpu")
    assert said.startswith(f"Error: recipe {path}: ") and message in said, said


@pytest.mark.parametrize(
    "storage",
    ["postgresql://tuner:s3cret@db/autotune", "postgresql://tuner@db/autotune?password=s3cret", "x:s3cret@host"],
)
@pytest.mark.parametrize("fmt", ["json", "yaml", "hf", "lightning"])
@pytest.mark.slow
def test_a_password_in_a_hand_made_recipe_is_never_exported(tmp_path, monkeypatch, storage, fmt):
    """`export` printed a password held in a hand-made recipe's study.storage: it is redacted
    when the recipe is read, as when one is written."""
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, recipe_dict(study__storage=storage))
    from click.testing import CliRunner

    from autotune.cli import main

    result = CliRunner().invoke(main, ["export", str(path), "--format", fmt])
    assert result.exit_code == 0, result.output
    assert "s3cret" not in result.output
    assert "s3cret" not in json.dumps(Recipe.load(path, check_environment=False).to_dict())
