"""The new knobs as values: parsed from --set, validated, combined, recorded."""

from __future__ import annotations

import pytest

from autotune.config import KNOBS, TrainConfig, parse_assignments, parse_knob
from autotune.errors import UsageError


@pytest.mark.parametrize(
    "knob, text, value",
    [
        ("compile_scope", "blocks+head", "blocks+head"),
        ("compile_scope", "model", "model"),
        ("loss_impl", "chunked", "chunked"),
        ("attention_mask", "document", "document"),
        ("expandable_segments", "true", True),
        ("expandable_segments", "off", False),
    ],
)
def test_parse(knob, text, value):
    assert parse_knob(knob, text) == value


@pytest.mark.parametrize(
    "knob, text, expected",
    [
        ("compile_scope", "head", "blocks | blocks+head | model"),
        ("loss_impl", "fused", "standard | chunked"),
        ("attention_mask", "padding", "causal | document"),
        ("expandable_segments", "maybe", "true or false"),
    ],
)
def test_bad_values_name_the_choices(knob, text, expected):
    with pytest.raises(UsageError) as info:
        parse_knob(knob, text)
    assert str(info.value) == f"invalid value {text!r} for {knob}: expected {expected}"


def test_defaults_are_todays_behaviour_and_recorded():
    cfg = TrainConfig()
    assert (cfg.compile_scope, cfg.loss_impl, cfg.attention_mask, cfg.expandable_segments) == (
        "blocks",
        "standard",
        "causal",
        False,
    )
    assert {"compile_scope", "loss_impl", "attention_mask", "expandable_segments"} <= set(KNOBS)
    strong = TrainConfig().with_overrides(
        parse_assignments(
            [
                "compile_mode=default",
                "compile_scope=model",
                "loss_impl=chunked",
                "batching=packed",
                "attention_mask=document",
                "expandable_segments=true",
            ]
        )
    )
    back = TrainConfig.from_dict(strong.to_dict())
    assert back == strong and back.to_dict()["compile_scope"] == "model"
    # A recipe or study written before these knobs reads as today's behaviour.
    old = {k: v for k, v in TrainConfig().to_dict().items() if k not in ("compile_scope", "loss_impl")}
    assert TrainConfig.from_dict(old) == TrainConfig()


def test_compile_scope_needs_compile():
    with pytest.raises(UsageError) as info:
        TrainConfig(compile_scope="model")
    assert str(info.value) == "compile_scope=model needs a compile_mode other than none (nothing is compiled)"
    assert TrainConfig(compile_mode="none", compile_scope="blocks").compile_scope == "blocks"


@pytest.mark.parametrize("field", ["expandable_segments"])
def test_booleans_are_booleans(field):
    with pytest.raises(UsageError, match=f"{field} must be true or false"):
        TrainConfig(**{field: "yes"})
