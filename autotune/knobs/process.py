"""The process stage (`registry.Stage.PROCESS`): the variables a trial process starts with, before
CUDA does, each hook `(cfg, environ) -> {name: value}` in PROCESS_STAGE's order. Torch-free: the
tuner starts its trials with it."""

from __future__ import annotations

from typing import Any

from autotune.config import TrainConfig
from autotune.knobs.allocator import allocator_env


def threads_env(cfg: TrainConfig, environ: dict[str, str]) -> dict[str, str]:
    """cpu_threads: OMP_NUM_THREADS, which the trial process applies at its start (it is forked
    from a server that imported torch: `trial.__main__`); 0 leaves the user's setting alone."""
    return {"OMP_NUM_THREADS": str(cfg.cpu_threads)} if cfg.cpu_threads else {}


def apply_threads_knob(model: Any, cfg: TrainConfig, where: Any) -> Any:
    """The model stage's hook for cpu_threads, where the process runs already (bench, verify, a
    recipe in the user's loop): the threads from now on."""
    if cfg.cpu_threads and where.device_kind == "cpu":
        import torch

        torch.set_num_threads(cfg.cpu_threads)
    return model


PROCESS_STAGE = (allocator_env, threads_env)  # expandable_segments: PYTORCH_CUDA_ALLOC_CONF; cpu_threads


def process_env(cfg: TrainConfig, environ: dict[str, str]) -> dict[str, str]:
    """What PROCESS_STAGE sets over `environ`, each hook seeing what the earlier ones set."""
    env: dict[str, str] = {}
    for hook in PROCESS_STAGE:
        env.update(hook(cfg, {**environ, **env}))
    return env
