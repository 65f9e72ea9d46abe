"""The trial process starts with the allocator setting of its configuration."""

from __future__ import annotations

import subprocess

import pytest

from autotune.config import RunSpec, TrainConfig
from autotune.trial import runner
from autotune.trial.runner import _child_env, run_trial


def test_child_env_carries_the_knob(monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:256")
    on = _child_env({"EXTRA": "1"}, TrainConfig(expandable_segments=True))
    off = _child_env(None, TrainConfig())
    assert on["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:256,expandable_segments:True"
    assert off["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:256,expandable_segments:False"
    assert on["EXTRA"] == "1" and on["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


@pytest.mark.process
def test_run_trial_starts_the_child_with_it(monkeypatch):
    seen: list[dict[str, str]] = []
    real_popen = subprocess.Popen

    def recording_popen(*args, **kwargs):
        seen.append(kwargs["env"])
        return real_popen(*args, **kwargs)

    monkeypatch.setattr(runner.subprocess, "Popen", recording_popen)
    spec = RunSpec(model="gpt2-tiny", device="cpu", warmup=1, steps=2, min_time_s=0)
    result = run_trial(spec, TrainConfig(expandable_segments=True), timeout_s=120)
    assert seen[0]["PYTORCH_CUDA_ALLOC_CONF"].endswith("expandable_segments:True")
    # On this CPU the child then says why it cannot run it (a CUDA allocator setting).
    assert result.outcome == "unsupported" and result.reason.startswith("expandable_segments:")
