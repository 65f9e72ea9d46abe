"""A generation configuration in Hugging Face's words: the `GenerationConfig` fields that
`generate` takes for it, as plain values (the compile settings as `CompileConfig`'s keyword
arguments). Made from each knob's `hf_generate` mapping in the registry, so the measured run
(`knobs.hf_generation`), the recipe (`recipe.generation`) and the export (`integrations.generation`)
say the same thing. Torch-free."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Mapping

from autotune import registry

PAD_ID = 0  # what fills a left-padded prompt's pad positions: never attended to


def generation_config_fields(config: Mapping[str, Any], new_tokens: int) -> dict[str, Any]:
    """`generate`'s GenerationConfig fields for a configuration (a GenerateConfig's dict):
    greedy, exactly `new_tokens` new tokens (no end-of-text stop), and each knob's fields."""
    fields: dict[str, Any] = {
        "max_new_tokens": new_tokens,
        "do_sample": False,
        "eos_token_id": None,  # a fixed length: the work is the same every call, as it was measured
        "pad_token_id": PAD_ID,
    }
    view = SimpleNamespace(cfg=SimpleNamespace(**config), new_tokens=new_tokens)
    for knob in registry.knobs_of(registry.GENERATE):
        if knob.hf_generate is not None:
            fields.update(knob.hf_generate(config[knob.name], view))
    return fields


def generation_notes(config: Mapping[str, Any]) -> list[str]:
    """What GenerationConfig cannot express of a configuration, one sentence each."""
    view = SimpleNamespace(cfg=SimpleNamespace(**config))
    notes = []
    for knob in registry.knobs_of(registry.GENERATE):
        if knob.hf_generate_note is not None and (note := knob.hf_generate_note(config[knob.name], view)):
            notes.append(note)
    return notes
