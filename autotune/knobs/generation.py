"""The generation knobs applied to autotune's GPT (Hugging Face models: `knobs.hf_generation`):

    dtype            the weights cast (inference runs in the dtype, no autocast), so the cache
                     is made in it too
    prefill_sdpa,    each function runs inside `sdpa_kernel` of its backend: inside, so that a
    decode_sdpa      compiled function traces the kernel asked for (dynamo reads the context
                     where it is entered), and a kernel that cannot run these inputs raises
                     instead of falling back to another one
    decode_compile,  torch.compile of the decode step (and of prefill too) with the mode;
    compile_prefill  `fullgraph=True`: a graph break in a decode step is a bug to see, not a
                     silent fallback to eager between two graphs
    kv_cache         the cache `GreedyDecoder` makes (`model.kv_cache`)

A static cache's step has one shape, compiled `dynamic=False` (the best kernels, one CUDA
graph); a dynamic cache's grows a position a token, left to torch's automatic dynamic shapes
(one recompile, then a dynamic length)."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn

from autotune.config import GenerateConfig
from autotune.knobs.precision import sdpa_backend
from autotune.model.decode import GreedyDecoder, decode_step, prefill

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def cast_model(model: nn.Module, dtype: str) -> nn.Module:
    """The model in `dtype`, in place, in inference mode (no dropout)."""
    return model.to(DTYPES[dtype]).eval()


def attention_of(function: Callable[..., torch.Tensor], backend: str) -> Callable[..., torch.Tensor]:
    """`function` run under the forced SDPA `backend` (auto: torch's choice)."""
    if backend == "auto":
        return function

    def forced(*args, **kwargs):
        with sdpa_backend(backend):
            return function(*args, **kwargs)

    forced.__name__ = f"{function.__name__}_{backend}"
    return forced


def compile_steps(
    prefill_fn: Callable[..., torch.Tensor], step_fn: Callable[..., torch.Tensor], cfg: GenerateConfig
) -> tuple[Callable[..., torch.Tensor], Callable[..., torch.Tensor]]:
    """The prefill and decode functions as `decode_compile` and `compile_prefill` make them."""
    if cfg.decode_compile == "none":
        return prefill_fn, step_fn
    static = cfg.kv_cache == "static"
    step_fn = torch.compile(step_fn, mode=cfg.decode_compile, fullgraph=True, dynamic=False if static else None)
    if cfg.compile_prefill:
        prefill_fn = torch.compile(prefill_fn, mode=cfg.decode_compile, fullgraph=True)
    return prefill_fn, step_fn


def gpt_decoder(model: nn.Module, cfg: GenerateConfig, *, max_len: int) -> GreedyDecoder:
    """autotune's GPT with every generation knob applied: cast, its cache made, its prefill and
    decode functions under their attention kernels and compiled as asked."""
    cast_model(model, cfg.dtype)
    prefill_fn, step_fn = compile_steps(
        attention_of(prefill, cfg.prefill_sdpa), attention_of(decode_step, cfg.decode_sdpa), cfg
    )
    return GreedyDecoder(
        model, cache_kind=cfg.kv_cache, batch=cfg.batch_size, max_len=max_len, prefill_fn=prefill_fn, step_fn=step_fn
    )
