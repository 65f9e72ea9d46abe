"""autotune.knobs.precision: sdpa_backend selects the kernel that really runs (and fails loudly
when it cannot), amp_dtype the matmul dtype, TF32 (torch 2.13's fp32_precision flags) is set
for the step and restored, the scaler only for float16. Each test observes the knob's effect,
not just that a field was stored."""

from __future__ import annotations

import pytest
import torch

from autotune.config import TrainConfig
from autotune.knobs.apply import training_context
from autotune.knobs.precision import fp32_precision, grad_scaler, precision, set_tf32
from autotune.measure.outcomes import is_sdpa_unsupported_error
from tests.helpers import FLASH_OP, MATH_OP, batch, tiny


def attention_ops(cfg: TrainConfig) -> set[str]:
    model = tiny()
    x, y = batch()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with training_context("cpu", cfg):
            model(x, y)
    return {e.name for e in prof.events() if "attention" in e.name}


def test_sdpa_backend_selects_the_kernel_that_runs():
    math_ops = attention_ops(TrainConfig(sdpa_backend="math"))
    flash_ops = attention_ops(TrainConfig(sdpa_backend="flash"))
    assert MATH_OP in math_ops and FLASH_OP not in math_ops
    assert FLASH_OP in flash_ops and MATH_OP not in flash_ops


def test_forced_backend_that_cannot_run_fails_loudly():
    # efficient attention has no CPU kernel: forcing it must raise at the SDPA call, not
    # silently fall back to another kernel and measure the wrong thing.
    model = tiny()
    x, y = batch()
    with pytest.raises(RuntimeError) as info:
        with training_context("cpu", TrainConfig(sdpa_backend="efficient")):
            model(x, y)
    assert is_sdpa_unsupported_error(info.value)
    assert not is_sdpa_unsupported_error(RuntimeError("shape mismatch"))
    assert not is_sdpa_unsupported_error(ValueError("No available kernel"))


@pytest.mark.parametrize(
    "amp, dtype", [("float32", torch.float32), ("bfloat16", torch.bfloat16), ("float16", torch.float16)]
)
def test_amp_dtype_sets_the_matmul_dtype(amp, dtype):
    linear = torch.nn.Linear(8, 8)
    x = torch.randn(2, 8)
    with precision("cpu", amp):
        assert linear(x).dtype == dtype
    assert linear(x).dtype == torch.float32  # only inside the context


def test_bfloat16_applies_to_the_whole_model_but_loss_stays_float32():
    model = tiny()
    x, y = batch()
    seen = []
    handle = model.transformer.h[0].mlp.c_fc.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    with training_context("cpu", TrainConfig(amp_dtype="bfloat16")):
        loss = model(x, y)
    handle.remove()
    assert seen == [torch.bfloat16]
    assert loss.dtype == torch.float32


def test_grad_scaler_only_for_float16():
    assert grad_scaler("cpu", "float16").is_enabled()
    for amp in ("float32", "bfloat16", "tf32"):
        assert not grad_scaler("cpu", amp).is_enabled()


def tf32_state() -> tuple[str, str, str, str]:
    """TF32 as torch 2.13 keeps it: the matmul flag, the legacy global inductor reads, and
    cuDNN's convolution and RNN flags."""
    cudnn = torch.backends.cudnn
    return (
        torch.backends.cuda.matmul.fp32_precision,
        torch.get_float32_matmul_precision(),
        cudnn.conv.fp32_precision,
        cudnn.rnn.fp32_precision,
    )


TF32_ON = ("tf32", "high", "tf32", "tf32")
TF32_OFF = ("ieee", "highest", "ieee", "ieee")


def test_tf32_is_set_inside_and_restored_after():
    saved_matmul = torch.get_float32_matmul_precision()
    saved_legacy_cudnn = torch.backends.cudnn.allow_tf32
    saved_cudnn = {op: getattr(torch.backends.cudnn, op).fp32_precision for op in ("conv", "rnn")}
    try:
        set_tf32(False)
        assert tf32_state() == TF32_OFF
        with fp32_precision("tf32"):
            assert tf32_state() == TF32_ON
        assert tf32_state() == TF32_OFF
        with pytest.raises(KeyError):  # restored on an error too
            with fp32_precision("tf32"):
                raise KeyError("boom")
        assert tf32_state() == TF32_OFF
        set_tf32(True)  # a caller that had TF32 on
        for amp in ("float32", "bfloat16", "float16"):
            with fp32_precision(amp):
                assert tf32_state() == TF32_OFF  # anything but tf32 means full float32 matmuls
            assert tf32_state() == TF32_ON
        # The forward pass's context leaves TF32 alone: it is the whole step's setting.
        set_tf32(False)
        with precision("cuda", "tf32"):
            assert tf32_state() == TF32_OFF
        # A caller that wrote the matmul flag directly (the legacy global then cannot be
        # read): its flag comes back.
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        with fp32_precision("float32"):
            assert tf32_state() == TF32_OFF
        assert torch.backends.cuda.matmul.fp32_precision == "tf32"
    finally:
        torch.set_float32_matmul_precision(saved_matmul)
        torch.backends.cudnn.allow_tf32 = saved_legacy_cudnn
        for op, value in saved_cudnn.items():
            getattr(torch.backends.cudnn, op).fp32_precision = value
