"""The trial process starts with the allocator setting of its configuration."""

from __future__ import annotations

import pytest

from autotune.config import RunSpec, TrainConfig
from autotune.trial import fork_server, runner
from autotune.trial.runner import run_trial


class Started(Exception):
    """Raised by the fake Popen: the process the trial would have started."""


def started_env(monkeypatch, cfg: TrainConfig, env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment run_trial starts its trial process with, without starting it."""
    seen: list[dict[str, str]] = []

    def start(argv, child_env, output, fork, model):
        seen.append(child_env)
        raise Started

    monkeypatch.setattr(runner, "_start", start)
    with pytest.raises(Started):
        run_trial(RunSpec(model="gpt2-tiny", device="cpu"), cfg, timeout_s=60, env=env)
    (started,) = seen
    return started


def test_child_env_carries_the_knob(monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:256")
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    on = started_env(monkeypatch, TrainConfig(expandable_segments=True), {"EXTRA": "1"})
    off = started_env(monkeypatch, TrainConfig())
    # The knob's value, explicitly, with the user's other allocator options kept.
    assert on["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:256,expandable_segments:True"
    assert off["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:256,expandable_segments:False"
    assert "PYTORCH_ALLOC_CONF" not in on  # the device-neutral name only when the user set it
    assert on["EXTRA"] == "1" and on["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    # The tuner's mark (the fork server and every trial carry it; see trial.fork_server).
    assert on[runner.TRIAL_TOKEN_ENV] == off[runner.TRIAL_TOKEN_ENV] == fork_server.token()

    # A shell that turns expandable segments on cannot turn a false trial into a true one; an
    # env given to run_trial is read as the trial's environment, and torch's device-neutral
    # name, when set, says the same.
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "garbage_collection_threshold:0.6")
    off = started_env(monkeypatch, TrainConfig())
    assert off["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:False"
    assert off["PYTORCH_ALLOC_CONF"] == "garbage_collection_threshold:0.6,expandable_segments:False"
    given = started_env(
        monkeypatch, TrainConfig(expandable_segments=True), {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"}
    )
    assert given["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128,expandable_segments:True"
    assert given["PYTORCH_ALLOC_CONF"] == "garbage_collection_threshold:0.6,expandable_segments:True"


@pytest.mark.process
def test_run_trial_starts_the_child_with_it(monkeypatch):
    seen: list[dict[str, str]] = []
    real_start = runner._start

    def recording_start(argv, env, output, fork, model):
        seen.append(env)
        return real_start(argv, env, output, fork, model)

    monkeypatch.setattr(runner, "_start", recording_start)
    spec = RunSpec(model="gpt2-tiny", device="cpu", warmup=1, steps=2, min_time_s=0)
    result = run_trial(spec, TrainConfig(expandable_segments=True), timeout_s=120)
    assert seen[0]["PYTORCH_CUDA_ALLOC_CONF"].endswith("expandable_segments:True")
    # On this CPU the child then says why it cannot run it (a CUDA allocator setting).
    assert result.outcome == "unsupported" and result.reason.startswith("expandable_segments:")
