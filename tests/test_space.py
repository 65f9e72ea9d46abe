"""Search spaces: loading and validation (each error names the file and the key or line),
conditional dimensions, checkpoint placements, rules, warm-start params and the hash."""

from __future__ import annotations

import textwrap
from pathlib import Path

import optuna
import pytest
from optuna.trial import FixedTrial

from autotune.config import TrainConfig
from autotune.errors import UsageError
from autotune.search.sampling import params_for, suggest
from autotune.search.space import SearchSpace, checkpoint_layers
from autotune.search.space_file import load_space

SPACES = Path(__file__).resolve().parent / "spaces"
TINY = SPACES / "tiny.yaml"
N_LAYER, SEQ_LEN = 2, 128  # gpt2-tiny

TINY_PARAMS = {"token_budget": 1024, "amp_dtype": "float32", "compile_mode": "none", "sdpa_backend": "math",
               "num_workers": 0, "checkpoint_count": 0}


def write(tmp_path: Path, text: str, name: str = "space.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def load(path: Path, n_layer: int | None = N_LAYER, seq_len: int | None = SEQ_LEN) -> SearchSpace:
    return load_space(path, n_layer=n_layer, seq_len=seq_len)


def load_error(path: Path, **kwargs) -> str:
    with pytest.raises(UsageError) as info:
        load(path, **kwargs)
    return str(info.value)


# --- loading and validation -------------------------------------------------------------------


def test_shipped_and_test_spaces_load():
    shipped = sorted((SPACES.parent.parent / "search_spaces").glob("*.yaml"))
    assert shipped
    for path in shipped + [SPACES / f"{name}.yaml" for name in ("tiny", "unsupported", "memory")]:
        big = path.stem == "gpt2"  # made for GPT-2 124M: 12 blocks, 1024 tokens
        space = load(path, n_layer=12 if big else 2, seq_len=1024 if big else 128)
        assert space.dimensions or space.checkpoint, path


def test_tiny_space_parsed():
    space = load(TINY)
    assert space.fixed == {"batching": "padded"}
    assert set(space.dimensions) == {"token_budget", "amp_dtype", "compile_mode", "sdpa_backend", "num_workers"}
    assert space.dimensions["token_budget"].choices == (1024, 2048)
    assert space.checkpoint.count.low == 0 and space.checkpoint.count.high == N_LAYER  # "n_layer", resolved
    assert space.checkpoint.placements == ("first", "last", "spread")
    assert space.rules == ()


def test_unknown_top_key(tmp_path):
    path = write(tmp_path, """\
        version: 1
        dimension:
          token_budget: {choices: [1024]}
        """)
    assert load_error(path) == (f"search space {path}: dimension: unknown key; "
                                "expected description, dimensions, fixed, rules, version")


def test_unknown_knob(tmp_path):
    path = write(tmp_path, """\
        dimensions:
          batch_size: {choices: [8, 16]}
        """)
    message = load_error(path)
    assert message.startswith(f"search space {path}: dimensions.batch_size: unknown knob; valid: num_workers, ")
    assert message.endswith(", checkpoint")
    assert "checkpoint_layers" not in message  # set through `checkpoint`, not directly


def test_unknown_knob_in_fixed_and_in_condition(tmp_path):
    fixed = write(tmp_path, """\
        fixed: {precision: bf16}
        dimensions: {token_budget: {choices: [1024]}}
        """, "fixed.yaml")
    assert load_error(fixed).startswith(f"search space {fixed}: fixed.precision: unknown knob; valid: ")
    cond = write(tmp_path, """\
        dimensions:
          num_workers: {choices: [0, 2]}
          prefetch_factor: {choices: [2], when: {workers: {gt: 0}}}
        """, "cond.yaml")
    assert load_error(cond).startswith(f"search space {cond}: dimensions.prefetch_factor.when.workers: unknown knob")


def test_unknown_dimension_key():
    path = SPACES / "unknown_key.yaml"
    assert load_error(path) == (f"search space {path}: dimensions.sdpa_backend.choice: unknown key; "
                                "expected choices, high, log, low, step, when")


def test_bad_value(tmp_path):
    path = write(tmp_path, """\
        dimensions:
          amp_dtype: {choices: [float32, float8]}
        """)
    assert load_error(path) == (f"search space {path}: dimensions.amp_dtype.choices: invalid value 'float8' "
                                "for amp_dtype: expected float32 | tf32 | float16 | bfloat16")


def test_bad_fixed_value(tmp_path):
    path = write(tmp_path, """\
        fixed: {batching: ragged}
        dimensions: {token_budget: {choices: [1024]}}
        """)
    assert load_error(path) == (f"search space {path}: fixed.batching: invalid value 'ragged' "
                                "for batching: expected fixed | padded | packed")


def test_categorical_knob_with_a_range(tmp_path):
    path = write(tmp_path, """\
        dimensions:
          amp_dtype: {low: 0, high: 2}
        """)
    assert load_error(path) == f"search space {path}: dimensions.amp_dtype: is categorical: give choices, not low/high"


def test_knob_both_fixed_and_searched(tmp_path):
    path = write(tmp_path, """\
        fixed: {token_budget: 1024}
        dimensions: {token_budget: {choices: [1024, 2048]}}
        """)
    assert load_error(path) == f"search space {path}: dimensions.token_budget: is also in fixed; keep it in one place"


def test_malformed_yaml_names_file_and_line():
    path = SPACES / "malformed.yaml"
    assert load_error(path) == (f"search space {path}: malformed YAML at line 4 "
                                "(expected ',' or '}', but got '<scalar>')")


def test_not_a_mapping_and_missing_file(tmp_path):
    path = write(tmp_path, "- token_budget\n")
    assert load_error(path) == f"search space {path}: expected a mapping with 'dimensions', got list"
    missing = tmp_path / "missing.yaml"
    assert load_error(missing) == f"search space {missing}: cannot read it (No such file or directory)"


def test_empty_dimensions(tmp_path):
    path = write(tmp_path, "version: 1\nfixed: {batching: padded}\n")
    assert load_error(path) == (f"search space {path}: dimensions: expected a non-empty mapping of "
                                "knob -> {choices: [...]} or {low, high}")


def test_unsupported_version(tmp_path):
    path = write(tmp_path, "version: 2\ndimensions: {token_budget: {choices: [1024]}}\n")
    assert load_error(path) == f"search space {path}: version: unsupported version 2; this autotune reads version 1"


def test_token_budget_below_context_rejected(tmp_path):
    path = write(tmp_path, """\
        dimensions:
          token_budget: {choices: [64, 1024]}
        """)
    assert load_error(path) == (f"search space {path}: dimensions.token_budget: 64 is smaller than the context "
                                "length 128: one full-length sequence must fit in a step")
    ranged = write(tmp_path, "dimensions: {token_budget: {low: 100, high: 4096, step: 4}}\n", "ranged.yaml")
    assert "dimensions.token_budget: 100 is smaller than the context length 128" in load_error(ranged)
    # Not bound to a model yet: nothing to check against.
    assert load(path, seq_len=None).dimensions["token_budget"].choices == (64, 1024)


def test_checkpoint_count_above_n_layer_rejected(tmp_path):
    path = write(tmp_path, """\
        dimensions:
          checkpoint:
            count: {low: 0, high: 3}
        """)
    assert load_error(path) == (f"search space {path}: dimensions.checkpoint.count: 3 blocks, but the model "
                                "has 2; use high: n_layer")
    choices = write(tmp_path, "dimensions: {checkpoint: {count: {choices: [0, 4]}}}\n", "choices.yaml")
    assert "dimensions.checkpoint.count: 4 blocks, but the model has 2" in load_error(choices)
    assert load(path, n_layer=12).checkpoint.count.high == 3


def test_bad_checkpoint_placement(tmp_path):
    path = write(tmp_path, """\
        dimensions:
          checkpoint:
            count: {low: 0, high: n_layer}
            placement: {choices: [first, middle]}
        """)
    assert load_error(path) == (f"search space {path}: dimensions.checkpoint.placement: expected {{choices: [...]}} "
                                "with values from first, last, spread")


def test_high_n_layer_resolves_to_the_models_depth():
    for n_layer in (2, 12):
        space = load(TINY, n_layer=n_layer)
        trial = optuna.create_study().ask()
        suggest(space, trial)
        dist = trial.distributions["checkpoint_count"]
        assert (dist.low, dist.high) == (0, n_layer)


# --- sampling ---------------------------------------------------------------------------------

CONDITIONAL = """\
    fixed: {batching: padded}
    dimensions:
      num_workers: {choices: [0, 2]}
      prefetch_factor: {choices: [2, 4], when: {num_workers: {gt: 0}}}
      persistent_workers: {choices: [true, false], when: {num_workers: {ge: 1}}}
      token_budget: {choices: [1024]}
    """


def test_conditional_dimension_only_when_workers(tmp_path):
    space = load(write(tmp_path, CONDITIONAL))
    cfg = suggest(space, FixedTrial({"num_workers": 0, "token_budget": 1024}))
    assert cfg.num_workers == 0 and cfg.prefetch_factor is None and cfg.persistent_workers is False
    cfg = suggest(space, FixedTrial({"num_workers": 2, "prefetch_factor": 4, "persistent_workers": True,
                                    "token_budget": 1024}))
    assert (cfg.num_workers, cfg.prefetch_factor, cfg.persistent_workers) == (2, 4, True)


def test_conditional_dimension_absent_from_trial_params(tmp_path):
    space = load(write(tmp_path, CONDITIONAL))
    study = optuna.create_study()
    for workers in (0, 2):
        study.enqueue_trial({"num_workers": workers})
        trial = study.ask()
        suggest(space, trial)
        assert ("prefetch_factor" in trial.params) == (workers > 0)
        assert ("persistent_workers" in trial.params) == (workers > 0)


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


def test_checkpoint_recorded_as_explicit_layers():
    space = load(TINY, n_layer=2)
    cfg = suggest(space, FixedTrial({**TINY_PARAMS, "checkpoint_count": 1, "checkpoint_placement": "first"}))
    assert cfg.checkpoint_layers == (0,)
    assert cfg.to_dict()["checkpoint_layers"] == [0]
    cfg = suggest(space, FixedTrial({**TINY_PARAMS, "checkpoint_count": 1, "checkpoint_placement": "last"}))
    assert cfg.checkpoint_layers == (1,)
    cfg = suggest(space, FixedTrial({**TINY_PARAMS, "checkpoint_count": 2, "checkpoint_placement": "spread"}))
    assert cfg.checkpoint_layers == (0, 1)
    # No placement is asked for when nothing is checkpointed.
    study = optuna.create_study()
    study.enqueue_trial(TINY_PARAMS)
    trial = study.ask()
    assert suggest(space, trial).checkpoint_layers == ()
    assert "checkpoint_placement" not in trial.params


def test_suggest_applies_fixed_knobs():
    cfg = suggest(load(TINY), FixedTrial({**TINY_PARAMS, "sdpa_backend": "flash", "token_budget": 2048}))
    assert cfg == TrainConfig(batching="padded", token_budget=2048, amp_dtype="float32", compile_mode="none",
                              sdpa_backend="flash", num_workers=0)


# --- rules ------------------------------------------------------------------------------------


def test_rule_violation():
    space = load(SPACES / "unsupported.yaml")
    base = TrainConfig(batching="padded", amp_dtype="float32", compile_mode="none", num_workers=0)
    reason = "this test space runs math attention only with 2048-token batches"
    assert space.violation(base.replace(sdpa_backend="math", token_budget=1024)) == reason
    assert space.violation(base.replace(sdpa_backend="math", token_budget=2048)) is None
    assert space.violation(base.replace(sdpa_backend="efficient", token_budget=1024)) is None


def test_rule_with_operator_and_default_reason(tmp_path):
    space = load(write(tmp_path, """\
        dimensions:
          num_workers: {choices: [0, 1, 4]}
          token_budget: {choices: [1024, 4096]}
        rules:
          - when: {num_workers: {ge: 2}}
            require: {token_budget: {ge: 4096}}
        """))
    assert space.violation(TrainConfig(num_workers=4, token_budget=1024)) == "violates rules[0]"
    assert space.violation(TrainConfig(num_workers=4, token_budget=4096)) is None
    assert space.violation(TrainConfig(num_workers=1, token_budget=1024)) is None


def test_malformed_rule(tmp_path):
    path = write(tmp_path, """\
        dimensions: {token_budget: {choices: [1024]}}
        rules:
          - when: {sdpa_backend: flash}
        """)
    assert load_error(path) == f"search space {path}: rules[0]: expected {{when: {{...}}, require: {{...}}, reason: text}}"


# --- warm-start params --------------------------------------------------------------------------


def _tiny_param_sets():
    for budget in (1024, 2048):
        for backend in ("math", "flash"):
            yield {**TINY_PARAMS, "token_budget": budget, "sdpa_backend": backend}
            for count in (1, 2):
                for placement in ("first", "last", "spread"):
                    yield {**TINY_PARAMS, "token_budget": budget, "sdpa_backend": backend,
                           "checkpoint_count": count, "checkpoint_placement": placement}


def test_params_for_round_trip():
    space = load(TINY)
    for params in _tiny_param_sets():
        cfg = suggest(space, FixedTrial(params))
        back = params_for(space, cfg)
        assert back is not None, params
        assert suggest(space, FixedTrial(back)) == cfg
        # The same params, except where two placements give the same blocks (of two blocks,
        # "last" and "spread" are both block 1; all blocks are all blocks whatever the placement).
        if params["checkpoint_count"] == 0 or params["checkpoint_placement"] == "first":
            assert back == params


def test_params_for_outside_the_space():
    space = load(TINY)
    cfg = suggest(space, FixedTrial(TINY_PARAMS))
    assert params_for(space, cfg.replace(token_budget=4096)) is None  # not a choice
    assert params_for(space, cfg.replace(batching="packed")) is None  # against a fixed knob
    no_ckpt = load(SPACES / "unsupported.yaml")
    assert params_for(no_ckpt, TrainConfig(batching="padded", amp_dtype="float32", compile_mode="none",
                                          sdpa_backend="math", token_budget=2048, checkpoint_layers=(0,))) is None


def test_params_for_conditional(tmp_path):
    space = load(write(tmp_path, CONDITIONAL))
    assert params_for(space, TrainConfig(num_workers=0, token_budget=1024)) == {"num_workers": 0, "token_budget": 1024}
    assert params_for(space, TrainConfig(num_workers=2, prefetch_factor=4, persistent_workers=False, token_budget=1024)) == {
        "num_workers": 2, "prefetch_factor": 4, "persistent_workers": False, "token_budget": 1024}


# --- identity ---------------------------------------------------------------------------------


def test_hash_stable_across_key_order_and_comments(tmp_path):
    a = write(tmp_path, """\
        version: 1
        fixed: {batching: padded}
        dimensions:
          token_budget: {choices: [1024, 2048]}
          sdpa_backend: {choices: [math, flash]}
        """, "a.yaml")
    b = write(tmp_path, """\
        # the same space, keys in another order
        dimensions:
          sdpa_backend: {choices: [math, flash]}   # attention
          token_budget:
            choices: [1024, 2048]
        fixed:
          batching: padded
        version: 1
        """, "b.yaml")
    assert load(a).hash == load(b).hash
    assert len(load(a).hash) == 16
    # Not the file name either, nor the model it is bound to.
    assert load(a, n_layer=12, seq_len=1024).hash == load(a).hash


def test_hash_changes_with_content(tmp_path):
    a = load(write(tmp_path, "dimensions: {token_budget: {choices: [1024, 2048]}}\n", "a.yaml"))
    b = load(write(tmp_path, "dimensions: {token_budget: {choices: [1024, 4096]}}\n", "b.yaml"))
    c = load(write(tmp_path, "dimensions: {token_budget: {choices: [2048, 1024]}}\n", "c.yaml"))
    assert len({a.hash, b.hash, c.hash}) == 3  # choice order is content: it is the sampler's order
    assert load(TINY).hash != load(SPACES / "unsupported.yaml").hash
