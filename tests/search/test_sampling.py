"""autotune.space.sampling: conditional dimensions, checkpoint layers recorded explicitly,
fixed knobs, and the params that reproduce a configuration (warm starts)."""

from __future__ import annotations

import optuna
from optuna.trial import FixedTrial

from autotune.config import TrainConfig
from autotune.space.sampling import params_for, suggest
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


def _tiny_param_sets(n_layer: int):
    """Every point of the tiny space at this depth, as the params `suggest` asks: a placement
    only for a partial count (none is none, all is all)."""
    for budget in (1024, 2048):
        for backend in ("math", "flash"):
            base = {**TINY_PARAMS, "token_budget": budget, "sdpa_backend": backend}
            yield base
            for count in range(1, n_layer):
                for placement in ("first", "last", "spread"):
                    yield {**base, "checkpoint_count": count, "checkpoint_placement": placement}
            yield {**base, "checkpoint_count": n_layer}


def test_params_for_round_trip():
    for n_layer in (2, 4):
        space = bind_space(TINY_SPACE, n_layer=n_layer)
        for params in _tiny_param_sets(n_layer):
            trial = FixedTrial(params)
            cfg = suggest(space, trial)
            assert trial.params == params  # exactly these were asked
            back = params_for(space, cfg)
            assert back is not None, params
            assert suggest(space, FixedTrial(back)) == cfg
            if n_layer == 2 and params.get("checkpoint_placement") in ("last", "spread"):
                # Of two blocks, "last" and "spread" are both block 1: either placement will do.
                assert back == {**params, "checkpoint_placement": back["checkpoint_placement"]}
                assert back["checkpoint_placement"] in ("last", "spread")
            else:  # every other placement gives its own blocks, and all blocks need none
                assert back == params


def test_placement_is_asked_only_for_a_partial_count():
    space = bind_space(TINY_SPACE, n_layer=2)
    study = optuna.create_study()
    for count, asked in ((0, False), (1, True), (2, False)):
        study.enqueue_trial({**TINY_PARAMS, "checkpoint_count": count})
        trial = study.ask()
        cfg = suggest(space, trial)
        assert ("checkpoint_placement" in trial.params) is asked
        assert len(cfg.checkpoint_layers) == count


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
