"""A trial's one-line configuration (`config_summary`): every knob that differs from its
default shows, so two different trials never print the same line; a default config's line
reads as it always has."""

from __future__ import annotations

import pytest

from autotune import registry
from autotune.config import GenerateConfig, TrainConfig
from autotune.present.text import config_summary

DEFAULT_LINE = "amp=float32 compile=none sdpa=auto budget=8192 batching=padded workers=0 ckpt=-"


def line(**changes) -> str:
    return config_summary(TrainConfig().replace(**changes).to_dict())


def test_default_config_line_is_unchanged():
    assert config_summary(TrainConfig().to_dict()) == DEFAULT_LINE


@pytest.mark.parametrize(
    ("base", "knob", "value", "shown"),
    [
        ({}, "loss_impl", "chunked", "loss_impl=chunked"),
        ({"compile_mode": "default"}, "compile_scope", "model", "compile_scope=model"),
        ({"num_workers": 2}, "persistent_workers", True, "persistent_workers=true"),
        ({"batching": "packed"}, "attention_mask", "document", "attention_mask=document"),
        ({}, "expandable_segments", True, "expandable_segments=true"),
    ],
)
def test_a_knob_off_its_default_shows(base, knob, value, shown):
    changed = line(**base, **{knob: value})
    assert shown in changed.split()
    assert changed != line(**base)


def test_configs_differing_in_one_unshown_knob_print_different_lines():
    assert line(loss_impl="chunked") != line()
    assert line(compile_mode="default", compile_scope="model") != line(compile_mode="default")
    assert line(num_workers=2, persistent_workers=True) != line(num_workers=2)


def test_extra_knobs_follow_the_fixed_head_in_registry_order():
    text = line(num_workers=2, persistent_workers=True, loss_impl="chunked", expandable_segments=True)
    assert text.startswith("amp=float32 compile=none sdpa=auto budget=8192 batching=padded workers=2 ")
    extras = [part.split("=")[0] for part in text.split() if "=" in part][7:]
    order = registry.names(registry.TRAIN)
    assert extras == sorted(extras, key=order.index) == ["persistent_workers", "loss_impl", "expandable_segments"]


def test_every_train_knob_off_its_default_changes_the_line():
    """Whatever knob is added to the registry, a trial that sets it reads differently."""
    default = TrainConfig().to_dict()
    for knob in registry.knobs_of(registry.TRAIN):
        if knob.ranks_only:
            continue
        other = next(v for v in _values(knob) if registry.value_text(v) != registry.value_text(knob.default))
        assert config_summary({**default, knob.name: other}) != DEFAULT_LINE, knob.name


def test_ranks_only_knobs_show_only_with_several_ranks():
    one_rank = {**TrainConfig().to_dict(), "bucket_cap_mb": 100}
    assert config_summary(one_rank) == DEFAULT_LINE  # meaningless without ranks: left out
    ddp = {**one_rank, "parallelism": "ddp"}
    assert config_summary(ddp).endswith(" parallelism=ddp bucket_cap_mb=100")
    assert "reshard_after_forward" not in config_summary({**ddp, "reshard_after_forward": True})


def test_generation_line_is_unchanged_and_covers_every_generation_knob():
    default = GenerateConfig().to_dict()
    assert config_summary(default) == "batch=1 cache=dynamic compile=none dtype=float32 sdpa=auto bucket=1"
    for knob in registry.knobs_of(registry.GENERATE):
        other = next(v for v in _values(knob) if registry.value_text(v) != registry.value_text(knob.default))
        base = dict(default)
        if knob.name == "compile_prefill":  # meaningful only with a compiled decode
            base["decode_compile"] = "default"
        assert config_summary({**base, knob.name: other}) != config_summary(base), knob.name


def _values(knob: registry.Knob) -> list:
    if knob.kind is registry.Kind.CHOICE:
        return list(knob.choices)
    if knob.kind is registry.Kind.BOOLEAN:
        return [False, True]
    if knob.kind is registry.Kind.BLOCKS:
        return [[], [0]]
    return [knob.low, knob.low + 1, knob.low + 2]
