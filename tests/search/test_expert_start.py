"""autotune.search.expert_start: what experts run first on each device class, clipped to the
space and checked as every proposal is; enqueued once per study, whatever the workers."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import pytest
from optuna.trial import FixedTrial, TrialState

from autotune.device.info import DeviceInfo
from autotune.knobs.support import DeviceCapabilities, check_supported
from autotune.model.sizes import ModelDims
from autotune.search.expert_start import EXPERT_ATTR, expert_configs
from autotune.search.run import open_search
from autotune.space.file import load_space
from autotune.space.sampling import suggest
from tests.helpers import TINY_SPACE, GiB, load, run_together, search_settings

SPACES = Path(__file__).resolve().parents[2] / "autotune" / "search_spaces"
CPU = DeviceInfo(kind="cpu", name="a CPU")
H200 = DeviceInfo(kind="cuda", name="NVIDIA H200", total_memory_bytes=150 * 10**9, compute_capability="9.0")
V100 = DeviceInfo(kind="cuda", name="Tesla V100", total_memory_bytes=32 * 10**9, compute_capability="7.0")
GPT2 = ModelDims(n_layer=12, d_model=768, vocab_size=50304)


@pytest.fixture
def triton(monkeypatch):
    """A CUDA machine has triton (torch.compile's backend); this CPU machine may not."""
    real = DeviceCapabilities.detect.__func__
    monkeypatch.setattr(
        DeviceCapabilities, "detect", classmethod(lambda cls, *a: dataclasses.replace(real(cls, *a), has_triton=True))
    )


def config_of(space, params, device):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = suggest(space, FixedTrial(params))
    assert space.violation(cfg) is None
    check_supported(cfg, DeviceCapabilities(device.kind, device.capability_tuple, True))
    return cfg


def test_on_a_cpu_what_the_cpu_sweep_found():
    space = load_space(SPACES / "cpu.yaml", n_layer=2, seq_len=128)
    (params,) = expert_configs(CPU, space)
    cfg = config_of(space, params, CPU)
    assert (cfg.amp_dtype, cfg.sdpa_backend, cfg.token_budget, cfg.compile_mode) == ("float32", "flash", 4096, "none")
    assert cfg.num_workers == 0 and cfg.checkpoint_layers == () and cfg.batching == "padded"


def test_clipped_to_the_space():
    space = load_space(TINY_SPACE, n_layer=2, seq_len=128)  # budgets 1024 and 2048 only
    (params,) = expert_configs(CPU, space)
    assert params["token_budget"] == 2048 and params["sdpa_backend"] == "flash"


def test_on_an_h200_bf16_flash_compile_packed_and_the_largest_budget_likely_to_fit(triton):
    space = load_space(SPACES / "gpt2.yaml", n_layer=12, seq_len=1024)
    (params,) = expert_configs(H200, space, memory_limit_bytes=int(0.9 * 150 * 10**9), model=GPT2)
    cfg = config_of(space, params, H200)
    assert (cfg.amp_dtype, cfg.sdpa_backend, cfg.compile_mode, cfg.compile_scope) == (
        "bfloat16",
        "flash",
        "default",
        "blocks+head",
    )
    assert cfg.batching == "packed" and cfg.num_workers == 4 and cfg.pin_memory and cfg.checkpoint_layers == ()
    # GPT-2 124M: about 0.9 MB per token; 65536 tokens (~59 GiB, x1.25) fit 135 GB, 131072 (~115 GiB) do not
    assert cfg.token_budget == 65536
    (small,) = expert_configs(H200, space, memory_limit_bytes=20 * GiB, model=GPT2)
    assert small["token_budget"] == 8192


def test_before_ampere_fp16_and_the_attention_it_runs(triton):
    space = load_space(SPACES / "gpt2.yaml", n_layer=12, seq_len=1024)
    (params,) = expert_configs(V100, space, memory_limit_bytes=28 * GiB, model=GPT2)
    cfg = config_of(space, params, V100)
    assert (cfg.amp_dtype, cfg.sdpa_backend) == ("float16", "efficient")


def test_without_triton_no_compile_and_without_a_shape_the_middle_budget():
    space = load_space(SPACES / "gpt2.yaml", n_layer=12, seq_len=1024)
    (params,) = expert_configs(dataclasses.replace(H200), space)
    assert params["compile_mode"] in ("none", "default")  # "none" where triton is missing
    assert params["token_budget"] == 32768  # the middle of 8192 ... 131072


def test_a_space_that_fixes_a_knob_the_device_cannot_run_has_no_expert_start():
    space = load_space(SPACES / "gpu_quick.yaml", n_layer=12, seq_len=1024)  # fixes bf16 and pinned memory
    assert expert_configs(CPU, space) == []


# --- once per study ----------------------------------------------------------------------------


def expert_trials(url: str, name: str):
    return [t for t in load(url, name).trials if t.user_attrs.get(EXPERT_ATTR)]


def test_enqueued_once_per_study_by_several_workers_and_on_resume(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    url = f"journal:{tmp_path / 's.journal'}"
    settings = search_settings(storage=url, study="s", memory_limit_bytes=2 * GiB)
    opened: list = []
    errors = run_together(3, lambda: opened.append(open_search(settings)))  # three workers at once
    assert not errors, errors
    assert sorted(o.is_new for o in opened) == [False, False, True]
    open_search(settings)  # a resume
    (expert,) = expert_trials(url, "s")
    assert expert.state == TrialState.WAITING and expert.user_attrs[EXPERT_ATTR] == "cpu-expert"
    assert expert.number == 2  # after the two references


def test_no_expert_start_on_request(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    url = f"journal:{tmp_path / 's.journal'}"
    open_search(search_settings(storage=url, study="s", memory_limit_bytes=2 * GiB, expert_start=False))
    assert expert_trials(url, "s") == []
