"""Model FLOPs utilization: the share of the device's peak that the model's own arithmetic
would use at the measured throughput (padding and recomputation are not useful work)."""

from __future__ import annotations

from autotune.device.flops import measured_peak_flops, peak_flops
from autotune.device.info import DeviceInfo
from autotune.model.introspect import ModelShape


def flops_per_token(n_params: int, shape: ModelShape, width: float) -> float | None:
    """6N + 12·L·H·Q·T FLOPs per token (PaLM appendix B, as in nanoGPT's estimate_mfu): N the
    non-embedding parameters with the tied head counted, T the sequence length attended over.
    None when the model does not say its heads."""
    if shape.n_head is None or shape.head_dim is None:
        return None
    return 6 * n_params + 12 * shape.n_layer * shape.n_head * shape.head_dim * width


def step_work(n_params: int, shape: ModelShape, rows: int, width: int) -> float:
    """A step's modelled FLOPs, pads included (they are computed): its positions times the
    FLOPs per token at its width; its positions alone where the model does not say its heads
    (the step-time spread and the interval then weigh steps by positions)."""
    return rows * width * (flops_per_token(n_params, shape, width) or 1.0)


def model_flops_utilization(
    tokens_per_sec: float,
    *,
    n_params: int,
    shape: ModelShape,
    width: float,
    device: DeviceInfo,
    amp_dtype: str,
    measured: bool = False,
) -> float | None:
    """MFU at the mean padded width of the timed batches; only useful (non-pad) tokens count.
    Against the datasheet's dense peak, or with `measured` against what a large matmul was
    measured to reach on this card (`device.flops.MEASURED_PEAK_FLOPS`). None where that peak
    is unknown (CPUs, devices missing from the table)."""
    peak = None
    if device.kind == "cuda":
        if measured:
            peak = (measured_peak_flops(device.name, amp_dtype) or (None, ""))[0]
        else:
            peak = peak_flops(device.name, amp_dtype)
    per_token = flops_per_token(n_params, shape, width)
    if peak is None or per_token is None:
        return None
    return per_token * tokens_per_sec / peak
