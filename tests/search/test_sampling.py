"""autotune.search.sampling: conditional dimensions, checkpoint layers recorded explicitly,
fixed knobs, and the params that reproduce a configuration (warm starts)."""

from __future__ import annotations

import optuna
from optuna.trial import FixedTrial

from autotune.config import TrainConfig
from autotune.search.sampling import params_for, suggest
from tests.helpers import SPACES, TINY_PARAMS, TINY_SPACE, bind_space, write_space


def test_high_n_layer_resolves_to_the_models_depth():
    for n_layer in (2, 12):
        space = bind_space(TINY_SPACE, n_layer=n_layer)
        trial = optuna.create_study().ask()
        suggest(space, trial)
        dist = trial.distributions["checkpoint_count"]
        assert (dist.low, dist.high) == (0, n_layer)


CONDITIONAL = """\
    fixed: {batching: padded}
    dimensions:
      num_workers: {choices: [0, 2]}
      prefetch_factor: {choices: [2, 4], when: {num_workers: {gt: 0}}}
      persistent_workers: {choices: [true, false], when: {num_workers: {ge: 1}}}
      token_budget: {choices: [1024]}
    """


def test_conditional_dimension_only_when_workers(tmp_path):
    space = bind_space(write_space(tmp_path, CONDITIONAL))
    cfg = suggest(space, FixedTrial({"num_workers": 0, "token_budget": 1024}))
    assert cfg.num_workers == 0 and cfg.prefetch_factor is None and cfg.persistent_workers is False
    cfg = suggest(
        space, FixedTrial({"num_workers": 2, "prefetch_factor": 4, "persistent_workers": True, "token_budget": 1024})
    )
    assert (cfg.num_workers, cfg.prefetch_factor, cfg.persistent_workers) == (2, 4, True)


def test_conditional_dimension_absent_from_trial_params(tmp_path):
    space = bind_space(write_space(tmp_path, CONDITIONAL))
    study = optuna.create_study()
    for workers in (0, 2):
        study.enqueue_trial({"num_workers": workers})
        trial = study.ask()
        suggest(space, trial)
        assert ("prefetch_factor" in trial.params) == (workers > 0)
        assert ("persistent_workers" in trial.params) == (workers > 0)


def test_checkpoint_recorded_as_explicit_layers():
    space = bind_space(TINY_SPACE, n_layer=2)
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
    cfg = suggest(bind_space(TINY_SPACE), FixedTrial({**TINY_PARAMS, "sdpa_backend": "flash", "token_budget": 2048}))
    assert cfg == TrainConfig(
        batching="padded",
        token_budget=2048,
        amp_dtype="float32",
        compile_mode="none",
        sdpa_backend="flash",
        num_workers=0,
    )


def _tiny_param_sets():
    for budget in (1024, 2048):
        for backend in ("math", "flash"):
            yield {**TINY_PARAMS, "token_budget": budget, "sdpa_backend": backend}
            for count in (1, 2):
                for placement in ("first", "last", "spread"):
                    yield {
                        **TINY_PARAMS,
                        "token_budget": budget,
                        "sdpa_backend": backend,
                        "checkpoint_count": count,
                        "checkpoint_placement": placement,
                    }


def test_params_for_round_trip():
    space = bind_space(TINY_SPACE)
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
    space = bind_space(TINY_SPACE)
    cfg = suggest(space, FixedTrial(TINY_PARAMS))
    assert params_for(space, cfg.replace(token_budget=4096)) is None  # not a choice
    assert params_for(space, cfg.replace(batching="packed")) is None  # against a fixed knob
    no_ckpt = bind_space(SPACES / "unsupported.yaml")
    assert (
        params_for(
            no_ckpt,
            TrainConfig(
                batching="padded",
                amp_dtype="float32",
                compile_mode="none",
                sdpa_backend="math",
                token_budget=2048,
                checkpoint_layers=(0,),
            ),
        )
        is None
    )


def test_params_for_conditional(tmp_path):
    space = bind_space(write_space(tmp_path, CONDITIONAL))
    assert params_for(space, TrainConfig(num_workers=0, token_budget=1024)) == {"num_workers": 0, "token_budget": 1024}
    assert params_for(
        space, TrainConfig(num_workers=2, prefetch_factor=4, persistent_workers=False, token_budget=1024)
    ) == {"num_workers": 2, "prefetch_factor": 4, "persistent_workers": False, "token_budget": 1024}
