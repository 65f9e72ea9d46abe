"""expandable_segments: the allocator setting a trial process starts with, and the one set
at run time in a process whose CUDA may already be running."""

from __future__ import annotations

import pytest
import torch

from autotune.config import TrainConfig
from autotune.knobs.allocator import allocator_env, apply_allocator_knob, with_option
from autotune.knobs.apply import Where

ON, OFF = TrainConfig(expandable_segments=True), TrainConfig()


def test_the_trial_environment_says_it_explicitly():
    assert allocator_env(ON, {}) == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    # False is written too: a user's shell setting must not turn a false trial into a true one.
    assert allocator_env(OFF, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}) == {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"
    }


def test_the_users_other_allocator_options_are_kept():
    env = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512, expandable_segments:False,roundup_power2_divisions:4"}
    assert allocator_env(ON, env)["PYTORCH_CUDA_ALLOC_CONF"] == (
        "max_split_size_mb:512,roundup_power2_divisions:4,expandable_segments:True"
    )
    # torch also reads the device-neutral name; when the user set it, it agrees.
    both = allocator_env(ON, {"PYTORCH_ALLOC_CONF": "garbage_collection_threshold:0.6"})
    assert both == {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "PYTORCH_ALLOC_CONF": "garbage_collection_threshold:0.6,expandable_segments:True",
    }
    assert with_option("", "k", "v") == "k:v"


@pytest.fixture
def allocator_settings():
    """torch's process-wide allocator settings (readable on a CPU build too), restored after."""
    if not hasattr(torch._C, "_accelerator_getAllocatorSettings"):
        pytest.skip(f"torch {torch.__version__} cannot read the allocator's settings back (torch 2.9 has no getter)")
    saved = torch._C._accelerator_getAllocatorSettings()
    yield torch._C._accelerator_getAllocatorSettings
    torch._C._accelerator_setAllocatorSettings(saved or "expandable_segments:False")


def test_in_process_it_is_set_on_cuda_only(allocator_settings):
    torch._C._accelerator_setAllocatorSettings("expandable_segments:False")
    apply_allocator_knob(None, ON, Where(None, "cpu"))
    apply_allocator_knob(None, OFF, Where(None, "cuda"))  # false leaves the process's own setting alone
    assert allocator_settings() == "expandable_segments:False"
    apply_allocator_knob(None, ON, Where(None, "cuda"))
    assert allocator_settings() == "expandable_segments:True"


def test_on_a_torch_without_the_device_neutral_setter_its_older_name_sets_it(monkeypatch):
    """torch 2.9 has no torch._C._accelerator_setAllocatorSettings (every trial with expandable
    segments crashed there): torch.cuda.memory._set_allocator_settings, its only setter."""
    seen: list[str] = []
    monkeypatch.delattr(torch._C, "_accelerator_setAllocatorSettings", raising=False)
    monkeypatch.setattr(torch.cuda.memory, "_set_allocator_settings", seen.append)
    apply_allocator_knob(None, ON, Where(None, "cuda"))
    assert seen == ["expandable_segments:True"]
