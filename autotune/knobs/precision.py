"""What every forward pass runs under: the AMP dtype (or TF32), the forced SDPA backend, and
the gradient scaler that float16 needs."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from autotune.config import SDPA_KERNELS, TrainConfig

_AUTOCAST_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


@contextlib.contextmanager
def precision(device_kind: str, amp_dtype: str) -> Iterator[None]:
    """AMP autocast for float16/bfloat16, TF32 matmuls for tf32, nothing for float32.
    TF32 is process-wide state in torch, so it is set here and restored on exit."""
    if amp_dtype == "tf32":
        saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        try:
            yield
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
        return
    dtype = _AUTOCAST_DTYPES.get(amp_dtype)
    with torch.autocast(device_type=device_kind, dtype=dtype, enabled=dtype is not None):
        yield


def sdpa_backend(backend: str) -> contextlib.AbstractContextManager[None]:
    """Force one SDPA backend: an unsupported input then raises instead of silently
    falling back to another kernel, which would make the trial measure the wrong thing."""
    if backend == "auto":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([getattr(SDPBackend, SDPA_KERNELS[backend])])


@contextlib.contextmanager
def training_context(device_kind: str, cfg: TrainConfig) -> Iterator[None]:
    """Everything a forward pass runs under: AMP dtype (or TF32) and the forced SDPA backend."""
    with precision(device_kind, cfg.amp_dtype), sdpa_backend(cfg.sdpa_backend):
        yield


def grad_scaler(device_kind: str, amp_dtype: str) -> torch.amp.GradScaler:
    """Loss scaling guards float16's narrow exponent; bfloat16 and float32 need none, and a
    disabled scaler is a no-op, so the training step has no branch."""
    return torch.amp.GradScaler(device_kind, enabled=amp_dtype == "float16")
