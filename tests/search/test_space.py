"""autotune.space.definition and space_file: loading and validation (each error names the file and
the key or line), checkpoint placements, rules, and the hash."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.config import TrainConfig
from autotune.errors import UsageError
from autotune.space.definition import checkpoint_layers
from tests.helpers import N_LAYER, SPACES, TINY_SPACE, bind_space, write_space


def load_error(path: Path, **kwargs) -> str:
    with pytest.raises(UsageError) as info:
        bind_space(path, **kwargs)
    return str(info.value)


def test_shipped_and_test_spaces_load():
    shipped = sorted((SPACES.parent.parent / "search_spaces").glob("*.yaml"))
    assert shipped
    for path in shipped + [SPACES / f"{name}.yaml" for name in ("tiny", "unsupported", "memory")]:
        big = path.stem == "gpt2"  # made for GPT-2 124M: 12 blocks, 1024 tokens
        space = bind_space(path, n_layer=12 if big else 2, seq_len=1024 if big else 128)
        assert space.dimensions or space.checkpoint, path


def test_tiny_space_parsed():
    space = bind_space(TINY_SPACE)
    assert space.fixed == {"batching": "padded"}
    assert set(space.dimensions) == {"token_budget", "amp_dtype", "compile_mode", "sdpa_backend", "num_workers"}
    assert space.dimensions["token_budget"].choices == (1024, 2048)
    assert space.checkpoint.count.low == 0 and space.checkpoint.count.high == N_LAYER  # "n_layer", resolved
    assert space.checkpoint.placements == ("first", "last", "spread")
    assert space.rules == ()


def test_unknown_top_key(tmp_path):
    path = write_space(
        tmp_path,
        """\
        version: 1
        dimension:
          token_budget: {choices: [1024]}
        """,
    )
    assert load_error(path) == (
        f"search space {path}: dimension: unknown key; expected description, dimensions, fixed, rules, version"
    )


def test_unknown_knob(tmp_path):
    path = write_space(
        tmp_path,
        """\
        dimensions:
          batch_size: {choices: [8, 16]}
        """,
    )
    message = load_error(path)
    assert message.startswith(f"search space {path}: dimensions.batch_size: unknown knob; valid: num_workers, ")
    assert message.endswith(", checkpoint")
    assert "checkpoint_layers" not in message  # set through `checkpoint`, not directly


def test_unknown_knob_in_fixed_and_in_condition(tmp_path):
    fixed = write_space(
        tmp_path,
        """\
        fixed: {precision: bf16}
        dimensions: {token_budget: {choices: [1024]}}
        """,
        "fixed.yaml",
    )
    assert load_error(fixed).startswith(f"search space {fixed}: fixed.precision: unknown knob; valid: ")
    cond = write_space(
        tmp_path,
        """\
        dimensions:
          num_workers: {choices: [0, 2]}
          prefetch_factor: {choices: [2], when: {workers: {gt: 0}}}
        """,
        "cond.yaml",
    )
    assert load_error(cond).startswith(f"search space {cond}: dimensions.prefetch_factor.when.workers: unknown knob")


def test_unknown_dimension_key():
    path = SPACES / "unknown_key.yaml"
    assert load_error(path) == (
        f"search space {path}: dimensions.sdpa_backend.choice: unknown key; "
        "expected choices, high, log, low, step, when"
    )


def test_bad_value(tmp_path):
    path = write_space(
        tmp_path,
        """\
        dimensions:
          amp_dtype: {choices: [float32, float8]}
        """,
    )
    assert load_error(path) == (
        f"search space {path}: dimensions.amp_dtype.choices: invalid value 'float8' "
        "for amp_dtype: expected float32 | tf32 | float16 | bfloat16"
    )


def test_bad_fixed_value(tmp_path):
    path = write_space(
        tmp_path,
        """\
        fixed: {batching: ragged}
        dimensions: {token_budget: {choices: [1024]}}
        """,
    )
    assert load_error(path) == (
        f"search space {path}: fixed.batching: invalid value 'ragged' for batching: expected fixed | padded | packed"
    )


def test_categorical_knob_with_a_range(tmp_path):
    path = write_space(
        tmp_path,
        """\
        dimensions:
          amp_dtype: {low: 0, high: 2}
        """,
    )
    assert load_error(path) == f"search space {path}: dimensions.amp_dtype: is categorical: give choices, not low/high"


def test_knob_both_fixed_and_searched(tmp_path):
    path = write_space(
        tmp_path,
        """\
        fixed: {token_budget: 1024}
        dimensions: {token_budget: {choices: [1024, 2048]}}
        """,
    )
    assert load_error(path) == f"search space {path}: dimensions.token_budget: is also in fixed; keep it in one place"


def test_malformed_yaml_names_file_and_line():
    path = SPACES / "malformed.yaml"
    assert load_error(path) == (
        f"search space {path}: malformed YAML at line 4 (expected ',' or '}}', but got '<scalar>')"
    )


def test_not_a_mapping_and_missing_file(tmp_path):
    path = write_space(tmp_path, "- token_budget\n")
    assert load_error(path) == f"search space {path}: expected a mapping with 'dimensions', got list"
    missing = tmp_path / "missing.yaml"
    assert load_error(missing) == f"search space {missing}: cannot read it (No such file or directory)"


def test_empty_dimensions(tmp_path):
    path = write_space(tmp_path, "version: 1\nfixed: {batching: padded}\n")
    assert load_error(path) == (
        f"search space {path}: dimensions: expected a non-empty mapping of knob -> {{choices: [...]}} or {{low, high}}"
    )


def test_unsupported_version(tmp_path):
    path = write_space(tmp_path, "version: 2\ndimensions: {token_budget: {choices: [1024]}}\n")
    assert load_error(path) == f"search space {path}: version: unsupported version 2; this autotune reads version 1"


def test_token_budget_below_context_rejected(tmp_path):
    path = write_space(
        tmp_path,
        """\
        dimensions:
          token_budget: {choices: [64, 1024]}
        """,
    )
    assert load_error(path) == (
        f"search space {path}: dimensions.token_budget: 64 is smaller than the context "
        "length 128: one full-length sequence must fit in a step"
    )
    ranged = write_space(tmp_path, "dimensions: {token_budget: {low: 100, high: 4096, step: 4}}\n", "ranged.yaml")
    assert "dimensions.token_budget: 100 is smaller than the context length 128" in load_error(ranged)
    # Not bound to a model yet: nothing to check against.
    assert bind_space(path, seq_len=None).dimensions["token_budget"].choices == (64, 1024)


def test_checkpoint_count_above_n_layer_rejected(tmp_path):
    path = write_space(
        tmp_path,
        """\
        dimensions:
          checkpoint:
            count: {low: 0, high: 3}
        """,
    )
    assert load_error(path) == (
        f"search space {path}: dimensions.checkpoint.count: 3 blocks, but the model has 2; use high: n_layer"
    )
    choices = write_space(tmp_path, "dimensions: {checkpoint: {count: {choices: [0, 4]}}}\n", "choices.yaml")
    assert "dimensions.checkpoint.count: 4 blocks, but the model has 2" in load_error(choices)
    assert bind_space(path, n_layer=12).checkpoint.count.high == 3


def test_bad_checkpoint_placement(tmp_path):
    path = write_space(
        tmp_path,
        """\
        dimensions:
          checkpoint:
            count: {low: 0, high: n_layer}
            placement: {choices: [first, middle]}
        """,
    )
    assert load_error(path) == (
        f"search space {path}: dimensions.checkpoint.placement: expected {{choices: [...]}} "
        "with values from first, last, spread"
    )


def test_checkpoint_placements():
    assert checkpoint_layers(0, "first", 12) == ()
    assert checkpoint_layers(3, "first", 12) == (0, 1, 2)
    assert checkpoint_layers(3, "last", 12) == (9, 10, 11)
    assert checkpoint_layers(3, "spread", 12) == (2, 6, 10)
    assert checkpoint_layers(2, "spread", 6) == (1, 4)
    assert checkpoint_layers(1, "spread", 2) == (1,)
    assert checkpoint_layers(12, "spread", 12) == tuple(range(12))
    assert checkpoint_layers(5, "last", 2) == (0, 1)  # clamped to the model's depth
    for count in range(13):
        for placement in ("first", "last", "spread"):
            layers = checkpoint_layers(count, placement, 12)
            assert len(layers) == count and all(0 <= i < 12 for i in layers)


def test_rule_violation():
    space = bind_space(SPACES / "unsupported.yaml")
    base = TrainConfig(batching="padded", amp_dtype="float32", compile_mode="none", num_workers=0)
    reason = "this test space runs math attention only with 2048-token batches"
    assert space.violation(base.replace(sdpa_backend="math", token_budget=1024)) == reason
    assert space.violation(base.replace(sdpa_backend="math", token_budget=2048)) is None
    assert space.violation(base.replace(sdpa_backend="efficient", token_budget=1024)) is None


def test_rule_with_operator_and_default_reason(tmp_path):
    space = bind_space(
        write_space(
            tmp_path,
            """\
        dimensions:
          num_workers: {choices: [0, 1, 4]}
          token_budget: {choices: [1024, 4096]}
        rules:
          - when: {num_workers: {ge: 2}}
            require: {token_budget: {ge: 4096}}
        """,
        )
    )
    assert space.violation(TrainConfig(num_workers=4, token_budget=1024)) == "violates rules[0]"
    assert space.violation(TrainConfig(num_workers=4, token_budget=4096)) is None
    assert space.violation(TrainConfig(num_workers=1, token_budget=1024)) is None


def test_malformed_rule(tmp_path):
    path = write_space(
        tmp_path,
        """\
        dimensions: {token_budget: {choices: [1024]}}
        rules:
          - when: {sdpa_backend: flash}
        """,
    )
    assert (
        load_error(path) == f"search space {path}: rules[0]: expected {{when: {{...}}, require: {{...}}, reason: text}}"
    )


def test_hash_stable_across_key_order_and_comments(tmp_path):
    a = write_space(
        tmp_path,
        """\
        version: 1
        fixed: {batching: padded}
        dimensions:
          token_budget: {choices: [1024, 2048]}
          sdpa_backend: {choices: [math, flash]}
        """,
        "a.yaml",
    )
    b = write_space(
        tmp_path,
        """\
        # the same space, keys in another order
        dimensions:
          sdpa_backend: {choices: [math, flash]}   # attention
          token_budget:
            choices: [1024, 2048]
        fixed:
          batching: padded
        version: 1
        """,
        "b.yaml",
    )
    assert bind_space(a).hash == bind_space(b).hash
    assert len(bind_space(a).hash) == 16
    # Not the file name either, nor the model it is bound to.
    assert bind_space(a, n_layer=12, seq_len=1024).hash == bind_space(a).hash


def test_hash_changes_with_content(tmp_path):
    a = bind_space(write_space(tmp_path, "dimensions: {token_budget: {choices: [1024, 2048]}}\n", "a.yaml"))
    b = bind_space(write_space(tmp_path, "dimensions: {token_budget: {choices: [1024, 4096]}}\n", "b.yaml"))
    c = bind_space(write_space(tmp_path, "dimensions: {token_budget: {choices: [2048, 1024]}}\n", "c.yaml"))
    assert len({a.hash, b.hash, c.hash}) == 3  # choice order is content: it is the sampler's order
    assert bind_space(TINY_SPACE).hash != bind_space(SPACES / "unsupported.yaml").hash
