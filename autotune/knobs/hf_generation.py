"""Generation with a Hugging Face model, through its own `generate`, as a user calls it.

The knobs map to what the installed transformers (5.x) reads, checked in its source
(transformers/generation/utils.py), not guessed:

    kv_cache=static      `cache_implementation="static"`: a StaticCache sized for the prompt
                         width plus max_new_tokens (GenerationMixin._prepare_static_cache)
    decode_compile=MODE  `compile_config=CompileConfig(mode=MODE)`: generate compiles the
                         decode step's forward itself (get_compiled_call), only with a static
                         cache (_valid_auto_compile_criteria), only on CUDA unless the config's
                         `_compile_all_devices` says otherwise (set here on a CPU)
    decode_compile=none  `disable_compile=True`: with a static cache on CUDA, generate would
                         otherwise compile on its own (reduce-overhead), unasked
    dtype                the model cast; prefill_sdpa = decode_sdpa: generate runs under it

What generate cannot do is refused by the registry's model rules before anything runs: a
compiled prefill (it compiles the decode forward only), two SDPA backends, a compiled decode
over a dynamic cache, a static cache for a model that keeps its own.

Every run generates exactly `new_tokens`: the end-of-text token is no stop (eos_token_id
None in the GenerationConfig). A logits processor calls `mark()` after each forward, so the
per-token timestamps come from the loop generate itself runs."""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn as nn

from autotune.config import GenerateConfig
from autotune.knobs.generation import cast_model
from autotune.knobs.precision import sdpa_backend
from autotune.model.decode import PromptBatch
from autotune.model.generation_fields import generation_config_fields


def generation_kwargs(cfg: GenerateConfig, new_tokens: int, *, device_kind: str) -> dict[str, Any]:
    """`generate`'s keyword arguments for `cfg` (`model.generation_fields`), its compile settings
    as the installed transformers' CompileConfig."""
    from transformers import CompileConfig

    kwargs = generation_config_fields(cfg.to_dict(), new_tokens)
    if "compile_config" in kwargs:
        compile_config = CompileConfig(**kwargs["compile_config"])
        if device_kind != "cuda":
            compile_config._compile_all_devices = True  # transformers' own switch to compile off CUDA
        kwargs["compile_config"] = compile_config
    return kwargs


class _Marker:
    """A logits processor that only marks the time: called once per forward, scores untouched."""

    def __init__(self, mark: Callable[[], None]) -> None:
        self.mark = mark

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.mark()
        return scores


class HfGenerator:
    """A transformers model generating with `cfg`'s knobs."""

    def __init__(self, model: nn.Module, cfg: GenerateConfig) -> None:
        self.model = cast_model(model, cfg.dtype)
        self.cfg = cfg
        self.device = next(model.parameters()).device
        self.cache = None  # transformers makes its own, per call

    @torch.inference_mode()
    def generate(self, prompts: PromptBatch, new_tokens: int, mark: Callable[[], None] = lambda: None) -> torch.Tensor:
        from transformers import GenerationConfig, LogitsProcessorList

        prompts = prompts.to(self.device)
        config = GenerationConfig(**generation_kwargs(self.cfg, new_tokens, device_kind=self.device.type))
        with sdpa_backend(self.cfg.decode_sdpa):  # one backend for the whole call (a model rule)
            mark()
            out = self.model.generate(
                input_ids=prompts.ids,
                attention_mask=prompts.valid.long(),
                generation_config=config,
                logits_processor=LogitsProcessorList([_Marker(mark)]),
            )
        return out[:, prompts.width :]
