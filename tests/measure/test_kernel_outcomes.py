"""A kernel library with no kernel for a configuration on this device makes it `unsupported`
(never retried, not a crash); its allocation failures are `oom`; real failures stay crashes."""

from __future__ import annotations

import pytest

from autotune.measure import outcomes


class InductorError(RuntimeError):
    """Stands for torch._inductor.exc.InductorError, which wraps what inductor caught."""


def wrapped(inner: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as exc:
            raise InductorError("LoweringException: see above") from exc
    except BaseException as outer:  # noqa: BLE001
        return outer


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError("cuDNN Frontend error: [cudnn_frontend] Error: No execution plans support the graph."),
        RuntimeError("cuDNN Frontend error: No valid execution plans built."),
        RuntimeError(
            "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in a non-contiguous input."
        ),
        RuntimeError("Unable to find a valid cuDNN algorithm to run convolution"),
        RuntimeError("CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling `cublasLtMatmul( ltHandle, ...)`"),
        RuntimeError("CUDA error: no kernel image is available for execution on the device"),
        RuntimeError("FlashAttention only supports Ampere GPUs or newer."),
        wrapped(RuntimeError("NoValidChoicesError: No choices to select, please consider adding ATEN")),
        wrapped(RuntimeError("out of resource: shared memory, Required: 232448, Hardware limit: 166912.")),
    ],
)
def test_kernel_selection_errors_are_unsupported(exc):
    outcome, reason = outcomes.classify_exception(exc)
    assert outcome == outcomes.UNSUPPORTED
    assert reason.startswith("no kernel for this configuration on this device (")


def test_library_allocation_failures_are_oom_and_real_failures_stay_crashes():
    cases = [
        (RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"), outcomes.OOM),
        (wrapped(RuntimeError("CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate(handle)")), outcomes.OOM),
        (RuntimeError("cuDNN error: CUDNN_STATUS_EXECUTION_FAILED"), outcomes.CRASHED),
        (RuntimeError("CUDA error: an illegal memory access was encountered"), outcomes.CRASHED),
    ]
    assert [outcomes.classify_exception(exc)[0] for exc, _ in cases] == [outcome for _, outcome in cases]
    # An error raised while handling another one was not caused by it: it is judged alone.
    try:
        try:
            raise RuntimeError("CUDNN_STATUS_NOT_SUPPORTED")
        except RuntimeError:
            raise ValueError("a bug in the handler") from None
    except ValueError as exc:
        assert outcomes.classify_exception(exc)[0] == outcomes.CRASHED
