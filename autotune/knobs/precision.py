"""What a training step runs under: the AMP dtype for the forward pass, TF32 for the whole
step, the forced SDPA backend, and the gradient scaler that float16 needs.

TF32 is process-wide state, read by every float32 matmul and convolution when it runs,
and by inductor when it generates a kernel. A forward-only context would leave the
backward pass (two thirds of the FLOPs), the optimizer step and the backward graph that
torch.compile generates lazily, during the first backward, in full float32. So TF32 is set
once for the whole run (`fp32_precision`), never per forward pass.

The API, as torch 2.13 reads it: `torch.set_float32_matmul_precision("high")` sets the
per-backend matmul flags (`torch.backends.cuda.matmul.fp32_precision == "tf32"`) *and* the
legacy global that inductor still reads (`torch.get_float32_matmul_precision()`, in its
autotuning cache keys). Writing `torch.backends.cuda.matmul.fp32_precision` alone leaves that
global unset, and torch 2.13 then raises ("mix of the legacy and new APIs") when inductor
reads it. Convolutions alike: reading the legacy `torch.backends.cudnn.allow_tf32` (inductor's
convolution lowering does) raises unless `torch.backends.cudnn.{conv,rnn}.fp32_precision` and
the legacy flag agree, and the per-op setters leave the legacy flag as it was. So cuDNN is set
through the legacy setter, which sets the per-op flags with it (torch >= 2.9), then each op
explicitly ("ieee" rather than the legacy setter's "none", which would inherit a process-wide
`torch.backends.fp32_precision`): both APIs say the same, whichever one inductor or a user's
model reads.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch

from autotune.config import SDPA_KERNELS

_AUTOCAST_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def precision(device_kind: str, amp_dtype: str) -> contextlib.AbstractContextManager[None]:
    """The forward pass's precision: AMP autocast for float16/bfloat16; nothing for float32
    and tf32 (TF32 is set for the whole step, by `fp32_precision`)."""
    dtype = _AUTOCAST_DTYPES.get(amp_dtype)
    return torch.autocast(device_type=device_kind, dtype=dtype, enabled=dtype is not None)


def sdpa_backend(backend: str) -> contextlib.AbstractContextManager[None]:
    """Force one SDPA backend: an unsupported input then raises instead of silently
    falling back to another kernel, which would make the trial measure the wrong thing."""
    if backend == "auto":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([getattr(SDPBackend, SDPA_KERNELS[backend])])


def grad_scaler(device_kind: str, amp_dtype: str) -> torch.amp.GradScaler:
    """Loss scaling guards float16's narrow exponent; bfloat16 and float32 need none, and a
    disabled scaler is a no-op, so the training step has no branch."""
    return torch.amp.GradScaler(device_kind, enabled=amp_dtype == "float16")


# --- TF32: process-wide, for the whole step ----------------------------------------------------

_CUDNN_OPS = ("conv", "rnn")


def set_tf32(enabled: bool) -> None:
    """TF32 on or off for float32 matmuls and cuDNN convolutions, process-wide, so that the
    legacy and the new APIs agree and either can be read (see the module docstring)."""
    torch.set_float32_matmul_precision("high" if enabled else "highest")
    _set_cudnn(enabled, {op: "tf32" if enabled else "ieee" for op in _CUDNN_OPS})


def _set_cudnn(legacy: bool | None, per_op: dict[str, str]) -> None:
    """The legacy flag first (its setter also sets the per-op flags), then each op's own."""
    if legacy is not None:
        torch.backends.cudnn.allow_tf32 = legacy
    for op, value in per_op.items():
        getattr(torch.backends.cudnn, op).fp32_precision = value


def _legacy(read: Callable[[], Any]) -> Any:
    try:
        return read()
    except RuntimeError:  # the legacy and new APIs were mixed by someone: no single answer
        return None


@contextlib.contextmanager
def fp32_precision(amp_dtype: str) -> Iterator[None]:
    """TF32 for tf32 runs, true float32 otherwise, for everything inside: forward, backward,
    optimizer step and the kernels torch.compile generates meanwhile. The previous settings
    come back on exit, through the same APIs."""
    saved_legacy = _legacy(torch.get_float32_matmul_precision)
    saved_matmul = torch.backends.cuda.matmul.fp32_precision
    saved_cudnn = _legacy(lambda: torch.backends.cudnn.allow_tf32)
    saved = {op: getattr(torch.backends.cudnn, op).fp32_precision for op in _CUDNN_OPS}
    set_tf32(amp_dtype == "tf32")
    try:
        yield
    finally:
        if saved_legacy is not None:
            torch.set_float32_matmul_precision(saved_legacy)
        else:
            torch.backends.cuda.matmul.fp32_precision = saved_matmul
        _set_cudnn(saved_cudnn, saved)
