"""The CUDA caching allocator's `expandable_segments` (knob `expandable_segments`).

With it, the allocator maps more memory into an existing segment instead of allocating a
new one when a larger block is needed: batches of varying shape then fragment the cache
less (fewer cudaMalloc/cudaFree calls, a lower reserved peak). The allocator reads it from
PYTORCH_CUDA_ALLOC_CONF when it starts, so a trial process is started with it in its
environment (`allocator_env`, the process stage's hook in `knobs.process`); in a process whose
CUDA is already running (bench, a recipe applied in training code) `apply_allocator_knob` sets
it for the segments allocated from then on."""

from __future__ import annotations

from typing import Any, Mapping

from autotune.config import TrainConfig

ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"
# torch >= 2.9 also reads the device-neutral name; when the user's environment sets it, the
# option goes there too, so the two never disagree.
ALLOC_CONF_ALIASES = ("PYTORCH_ALLOC_CONF",)
OPTION = "expandable_segments"


def allocator_env(cfg: TrainConfig, environ: Mapping[str, str]) -> dict[str, str]:
    """The allocator variables a trial process starts with: the knob's value, explicitly
    (true or false, so the user's shell cannot turn a false trial into a true one), with the
    other options of the user's setting kept."""
    value = "True" if cfg.expandable_segments else "False"
    names = (ALLOC_CONF,) + tuple(name for name in ALLOC_CONF_ALIASES if name in environ)
    return {name: with_option(environ.get(name, ""), OPTION, value) for name in names}


def with_option(conf: str, key: str, value: str) -> str:
    """`conf` ("k1:v1,k2:v2") with `key` set to `value`, the other options in their order."""
    options = [part for part in conf.split(",") if part.strip() and part.split(":", 1)[0].strip() != key]
    return ",".join(options + [f"{key}:{value}"])


def set_allocator_settings(settings: str) -> None:
    """The caching allocator's settings from now on, as PYTORCH_CUDA_ALLOC_CONF writes them:
    through torch's device-neutral entry point where it has one (torch 2.13 here, where
    torch.cuda.memory's older name warns that it is deprecated), else through that older name
    (torch 2.9, which has only it)."""
    import torch

    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
    if setter is None:
        setter = torch.cuda.memory._set_allocator_settings
    setter(settings)


def apply_allocator_knob(model: Any, cfg: TrainConfig, where: Any) -> Any:
    """The model stage's hook for `expandable_segments` (first): in this process, on CUDA, turn
    expandable segments on for the allocations to come. Only on: a false knob leaves the process's
    own setting alone (a trial process gets an explicit false from `allocator_env`)."""
    if where.device_kind == "cuda" and cfg.expandable_segments:
        set_allocator_settings(f"{OPTION}:True")
    return model
