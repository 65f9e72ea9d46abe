"""The process stage (`registry.Stage.PROCESS`): the variables a trial process starts with, before
CUDA does, each hook `(cfg, environ) -> {name: value}` in PROCESS_STAGE's order. Torch-free: the
tuner starts its trials with it."""

from __future__ import annotations

from autotune.config import TrainConfig
from autotune.knobs.allocator import allocator_env

PROCESS_STAGE = (allocator_env,)  # expandable_segments: PYTORCH_CUDA_ALLOC_CONF


def process_env(cfg: TrainConfig, environ: dict[str, str]) -> dict[str, str]:
    """What PROCESS_STAGE sets over `environ`, each hook seeing what the earlier ones set."""
    env: dict[str, str] = {}
    for hook in PROCESS_STAGE:
        env.update(hook(cfg, {**environ, **env}))
    return env
