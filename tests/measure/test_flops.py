"""autotune.measure.flops: model FLOPs utilization matches nanoGPT's by hand, and is None where
the peak or the model's shape is unknown."""

from __future__ import annotations

import pytest

from autotune.device import DeviceInfo
from autotune.measure.flops import model_flops_utilization
from autotune.model.introspect import model_shape, non_embedding_params
from autotune.model.load import build_model
from tests.helpers import meta_model


class Shaped:
    """A model's MFU inputs, as the measuring loop reads them (built on the meta device)."""

    def __init__(self, device_name: str, amp_dtype: str = "bfloat16", kind: str = "cuda", model: str = "gpt2") -> None:
        self.info = DeviceInfo(kind=kind, name=device_name, compute_capability="9.0" if kind == "cuda" else None)
        self.amp_dtype = amp_dtype
        built = meta_model(model)
        self.shape = model_shape(built)
        self.n_params = non_embedding_params(built)

    def mfu(self, tokens_per_sec: float, width: float) -> float | None:
        return model_flops_utilization(
            tokens_per_sec,
            n_params=self.n_params,
            shape=self.shape,
            width=width,
            device=self.info,
            amp_dtype=self.amp_dtype,
        )


def test_mfu_matches_nanogpt_for_gpt2():
    # By hand, nanoGPT's estimate_mfu: N = 123,689,472 non-embedding parameters (124,475,904
    # minus the 1024 x 768 position table); per token 6N + 12 * L * H * Q * T with L=12, H=12,
    # Q=64, T=1024: 742,136,832 + 113,246,208 = 855,383,040 FLOPs.
    per_token = 6 * 123_689_472 + 12 * 12 * 12 * 64 * 1024
    assert per_token == 855_383_040
    run = Shaped("NVIDIA H100 80GB HBM3")
    assert run.n_params == 123_689_472
    mfu = run.mfu(400_000.0, 1024)
    assert mfu == pytest.approx(per_token * 400_000 / 989e12)
    assert mfu == pytest.approx(0.3460, abs=1e-4)
    # Shorter padded sequences cost less attention per token.
    assert run.mfu(400_000.0, 512) < mfu
    # The peak follows the compute dtype: float32 on an H100 is 66.9 TFLOP/s.
    assert Shaped("NVIDIA H100 80GB HBM3", "float32").mfu(10_000.0, 1024) == pytest.approx(per_token * 10_000 / 66.9e12)


def test_mfu_is_none_where_unknown():
    assert Shaped("Some Future GPU").mfu(1000.0, 1024) is None
    assert Shaped("cpu", kind="cpu").mfu(1000.0, 1024) is None
    run = Shaped("NVIDIA H100 80GB HBM3")
    run.shape = model_shape(build_model("tests.fixture_models:make_llama"))  # no head count
    assert run.mfu(1000.0, 64) is None
