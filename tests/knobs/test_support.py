"""autotune.knobs.support: what each device can run; the rest is rejected, naming the knob."""

from __future__ import annotations

import pytest

from autotune.config import TrainConfig
from autotune.errors import UnsupportedConfig
from autotune.knobs.support import DeviceCapabilities, check_supported

CPU = DeviceCapabilities(kind="cpu")


HOPPER = DeviceCapabilities(kind="cuda", compute_capability=(9, 0))


TURING = DeviceCapabilities(kind="cuda", compute_capability=(7, 5))


@pytest.mark.parametrize(
    "knobs, knob",
    [
        ({"sdpa_backend": "efficient"}, "sdpa_backend"),
        ({"sdpa_backend": "cudnn"}, "sdpa_backend"),
        ({"pin_memory": True}, "pin_memory"),
        ({"amp_dtype": "tf32"}, "amp_dtype"),
        ({"compile_mode": "reduce-overhead", "batching": "packed"}, "compile_mode"),
    ],
)
def test_cpu_rejects_cuda_only_knobs(knobs, knob):
    with pytest.raises(UnsupportedConfig) as info:
        check_supported(TrainConfig(**knobs), CPU)
    assert info.value.knob == knob and str(info.value).startswith(f"{knob}: ")


@pytest.mark.parametrize(
    "knobs",
    [
        {},
        {"sdpa_backend": "math"},
        {"sdpa_backend": "flash"},
        {"amp_dtype": "bfloat16"},
        {"amp_dtype": "float16"},
        {"compile_mode": "default"},
        {"checkpoint_layers": (0,)},
    ],
)
def test_cpu_accepts_what_it_can_run(knobs):
    check_supported(TrainConfig(**knobs), CPU)


def test_cuda_flash_needs_half_precision():
    with pytest.raises(UnsupportedConfig) as info:
        check_supported(TrainConfig(sdpa_backend="flash", amp_dtype="float32"), HOPPER)
    assert info.value.knob == "sdpa_backend" and "float32" in str(info.value)
    check_supported(TrainConfig(sdpa_backend="flash", amp_dtype="bfloat16"), HOPPER)
    check_supported(TrainConfig(sdpa_backend="efficient", amp_dtype="float32"), HOPPER)
    graphs = TrainConfig(amp_dtype="tf32", compile_mode="reduce-overhead", batching="packed")
    check_supported(graphs.replace(pin_memory=True, num_workers=1), HOPPER)


@pytest.mark.parametrize("dtype", ["bfloat16", "tf32"])
def test_pre_ampere_rejects_bfloat16_and_tf32(dtype):
    with pytest.raises(UnsupportedConfig) as info:
        check_supported(TrainConfig(amp_dtype=dtype), TURING)
    assert info.value.knob == "amp_dtype" and "8.0" in str(info.value)
    check_supported(TrainConfig(amp_dtype="float16"), TURING)


def test_cuda_compile_needs_triton():
    no_triton = DeviceCapabilities(kind="cuda", compute_capability=(9, 0), has_triton=False)
    with pytest.raises(UnsupportedConfig) as info:
        check_supported(TrainConfig(compile_mode="default"), no_triton)
    assert info.value.knob == "compile_mode"
    check_supported(TrainConfig(), no_triton)
