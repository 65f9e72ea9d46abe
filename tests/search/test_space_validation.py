"""Spaces are checked whole when loaded (issue 14, items 5 and 10): what used to pass
validation and then crash mid-study (a step of 0, a negative step, log with low 0, a `when`
comparing with text, `fixed` as a list), what was silently collapsed or dropped (duplicate
keys, log with step), a YAML anchor bomb, a file without end, and more workers than the
machine takes. Every refusal is one line naming the file and key, exit 2, with nothing written;
and a space that loads samples without error."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from autotune.errors import UsageError
from autotune.space.file import load_space
from tests.attack_helpers import refused

N_LAYER, SEQ_LEN = 2, 128


def write(tmp_path: Path, text: str, name: str = "space.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def load_error(path: Path) -> str:
    with pytest.raises(UsageError) as info:
        load_space(path, n_layer=N_LAYER, seq_len=SEQ_LEN)
    return str(info.value)


BAD = {
    "step_zero": (
        "dimensions: {token_budget: {low: 1024, high: 4096, step: 0}}",
        "dimensions.token_budget.step: must be at least 1, got 0",
    ),
    "step_negative": (
        "dimensions: {token_budget: {low: 1024, high: 4096, step: -512}}",
        "dimensions.token_budget.step: must be at least 1, got -512",
    ),
    "log_low_zero": (
        "dimensions: {num_workers: {low: 0, high: 4, log: true}}",
        "dimensions.num_workers.low: log: true needs low >= 1, got 0",
    ),
    "log_with_step": (
        "dimensions: {token_budget: {low: 1024, high: 4096, log: true, step: 1024}}",
        "dimensions.token_budget: log: true samples without a step; drop step, or drop log",
    ),
    "log_not_bool": (
        "dimensions: {token_budget: {low: 1024, high: 4096, log: yes please}}",
        "dimensions.token_budget.log: expected true or false",
    ),
    "step_not_dividing": (
        "dimensions: {token_budget: {low: 1024, high: 4000, step: 1024}}",
        "dimensions.token_budget: high - low (2976) is not a multiple of step 1024",
    ),
    "when_with_text": (
        """\
        dimensions:
          num_workers: {choices: [0, 2]}
          prefetch_factor: {choices: [2], when: {num_workers: {gt: many}}}
        """,
        "dimensions.prefetch_factor.when.num_workers.gt: expected a number, got 'many'",
    ),
    "when_typo_value": (
        """\
        dimensions:
          amp_dtype: {choices: [float32, bfloat16]}
          token_budget: {choices: [1024], when: {amp_dtype: bf16}}
        """,
        "dimensions.token_budget.when.amp_dtype: invalid value 'bf16' for amp_dtype",
    ),
    "when_on_a_later_knob": (
        """\
        dimensions:
          prefetch_factor: {choices: [2], when: {num_workers: {gt: 0}}}
          num_workers: {choices: [0, 2]}
        """,
        "dimensions.prefetch_factor.when.num_workers: num_workers is not fixed or sampled before",
    ),
    "fixed_list": (
        "fixed: [batching, padded]\ndimensions: {token_budget: {choices: [1024]}}",
        "fixed: expected a mapping of knob -> value, got list",
    ),
    "duplicate_key": (
        """\
        dimensions:
          token_budget: {choices: [1024]}
          token_budget: {choices: [2048]}
        """,
        "malformed YAML at line 3 (duplicate key 'token_budget')",
    ),
    "alias": (
        """\
        dimensions:
          amp_dtype: &a {choices: [float32]}
          sdpa_backend: *a
        """,
        "malformed YAML at line 2 (anchors and aliases (&name, *name) are not allowed)",
    ),
    "bool_as_number": (
        "dimensions: {pin_memory: {choices: [0, 1]}}",
        "dimensions.pin_memory.choices: invalid value 0 for pin_memory: expected true or false",
    ),
    "text_as_number": (
        "dimensions: {num_workers: {choices: ['2']}}",
        "dimensions.num_workers.choices: invalid value '2' for num_workers: expected an integer",
    ),
    "repeated_choice": (
        "dimensions: {token_budget: {choices: [1024, 1024]}}",
        "dimensions.token_budget.choices: 1024 is listed twice",
    ),
    "version_true": (
        "version: true\ndimensions: {token_budget: {choices: [1024]}}",
        "version: unsupported version True",
    ),
    "rules_mapping": (
        "dimensions: {token_budget: {choices: [1024]}}\nrules: {when: {}, require: {}}",
        "rules: expected a list",
    ),
    "rule_without_require": (  # a null `require` loaded, then every trial crashed in the rule check
        "dimensions: {token_budget: {choices: [1024]}}\nrules: [{when: {token_budget: 1024}, require: null}]",
        "rules[0]: expected {when: {...}, require: {...}, reason: text}",
    ),
    "too_many_workers": (
        "dimensions: {num_workers: {choices: [0, 100]}}",
        "dimensions.num_workers: num_workers 100 is more than",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_space_is_refused_at_load(tmp_path, case):
    text, message = BAD[case]
    path = write(tmp_path, text)
    assert message in load_error(path)
    assert load_error(path).startswith(f"search space {path}: ")


def test_search_refuses_a_bad_space_before_any_trial_and_writes_nothing(tmp_path, monkeypatch):
    """The attacker's reproduction: `step: 0` ran the reference trials, then crashed mid-study."""
    path = write(tmp_path, BAD["step_zero"][0])
    message = refused(tmp_path, monkeypatch, "search", "--model", "gpt2-tiny", "--device", "cpu", "--space", str(path))
    assert "step: must be at least 1" in message


def test_an_anchor_bomb_is_refused_at_once(tmp_path):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}]" for i in range(1, 30)]
    path = write(tmp_path, "\n".join(lines) + "\ndimensions: {token_budget: {choices: [1024]}}\n")
    from tests.recipe.test_recipe_safety import count_composed_nodes

    monkeypatch = pytest.MonkeyPatch()
    composed = count_composed_nodes(monkeypatch)
    try:
        assert "anchors and aliases" in load_error(path)
    finally:
        monkeypatch.undo()
    assert 0 < composed[0] < 20  # refused at the first anchor, nothing expanded


def test_a_space_file_is_capped_in_size_and_read_as_a_regular_file(tmp_path):
    big = write(tmp_path, "# " + "x" * (2 << 20) + "\ndimensions: {token_budget: {choices: [1024]}}\n")
    assert "larger than 1024 KiB" in load_error(big)
    assert "not a regular file" in load_error(Path("/dev/zero"))
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("description: caf\u00e9\n".encode("latin-1"))
    assert "not UTF-8 text" in load_error(latin)


@pytest.mark.parametrize(
    "text",
    [
        "dimensions: {token_budget: {low: 1024, high: " + "9" * 5000 + "}}\n",
        "fixed: {num_workers: " + "9" * 5000 + "}\ndimensions: {token_budget: {choices: [1024]}}\n",
        "dimensions: {token_budget: {choices: [1024, " + "9" * 30 + "]}}\n",
    ],
    ids=["range", "fixed", "choice-beyond-64-bits"],
)
def test_a_huge_integer_in_a_space_is_one_line(tmp_path, text):
    """A 5000-digit integer gave Python's digit-limit traceback."""
    message = load_error(write(tmp_path, text))
    assert "integer" in message and "too large" in message and len(message) < 300, message
