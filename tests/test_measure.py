"""Tests of autotune.measure: a real short run has sane figures that agree with the batches
it stepped on; memory limits, unsupported configs and failures become outcomes; the MFU
formula matches nanoGPT's by hand; data waits are really measured."""

from __future__ import annotations

import math
import time

import pytest
import torch

import autotune.measure.loop
from autotune.config import RunSpec, TrainConfig
from autotune.data.datasets import make_dataset
from autotune.device import PEAK_FLOPS, DeviceInfo, peak_flops
from autotune.errors import UsageError
from autotune.measure.flops import model_flops_utilization
from autotune.measure.loop import measure
from autotune.measure.measurement import Measurement
from autotune.model.introspect import model_shape, non_embedding_params
from autotune.model.load import build_model
from autotune.units import format_bytes


def short_spec(**changes) -> RunSpec:
    return RunSpec(**{"model": "gpt2-tiny", "device": "cpu", "warmup": 1, "steps": 5, **changes})


# ------------------------------------------------------------------------ a real run


@pytest.fixture(scope="module")
def tiny_run() -> tuple[Measurement, list, list]:
    """One real measurement, shared by the field checks, with the batches it stepped on."""
    shapes, tokens = [], []
    real = autotune.measure.loop.build_dataloader

    def spy(*args, **kwargs):
        loader = real(*args, **kwargs)

        def batches():
            for x, y in loader:
                shapes.append(tuple(y.shape))
                tokens.append(int((y != -100).sum()))
                yield x, y

        class Loader:
            def __iter__(self):
                return batches()

        return Loader()

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(autotune.measure.loop, "build_dataloader", spy)
        m = measure(short_spec(), TrainConfig(token_budget=2048))
    return m, shapes, tokens


def test_real_run_is_ok_with_sane_figures(tiny_run):
    m, _, _ = tiny_run
    assert m.outcome == "ok" and m.reason is None
    assert m.tokens_per_sec > 0
    assert m.padded_tokens_per_sec >= m.tokens_per_sec
    assert 0 <= m.padding_fraction < 1
    assert m.step_time_median_s > 0 and m.step_time_cv >= 0
    assert 0 <= m.data_wait_fraction < 1
    assert m.steps >= 5 and m.warmup_steps == 1
    assert m.compile_time_s == 0.0 and m.recompiles_during_timing == 0
    assert m.peak_memory_bytes > 0 and m.peak_memory_source == "rss" and m.allocator_peak_bytes is None
    assert m.mfu is None  # no peak FLOPs for CPUs
    assert m.gpu_utilization is None
    assert m.device["kind"] == "cpu"
    assert math.isfinite(m.final_loss) and 4 < m.final_loss < 7  # ~ln(320) after a few steps
    assert m.model["name"] == "gpt2-tiny" and m.model["n_layer"] == 2 and m.model["seq_len"] == 128
    assert m.config == TrainConfig(token_budget=2048).to_dict()
    assert set(m.phase_s) >= {"setup", "warmup", "timed", "total"}


def test_real_run_figures_agree_with_the_batches(tiny_run):
    m, shapes, tokens = tiny_run
    timed = slice(m.warmup_steps, m.warmup_steps + m.steps)
    positions = sum(rows * width for rows, width in shapes[timed])
    assert len(shapes[timed]) == m.steps
    # Pads are counted from the batches themselves (labels == -100).
    assert m.padding_fraction == pytest.approx(1 - sum(tokens[timed]) / positions)
    # tokens_per_sec = non-pad tokens of the timed window / its wall time.
    wall = sum(tokens[timed]) / m.tokens_per_sec
    assert wall <= m.phase_s["timed"] + 1e-6
    assert wall >= m.step_time_median_s * math.ceil(m.steps / 2)  # half the steps took >= the median
    assert positions / m.padded_tokens_per_sec == pytest.approx(wall)


def test_measurement_round_trips_through_a_dict(tiny_run):
    m, _, _ = tiny_run
    assert Measurement.from_dict({**m.to_dict(), "unknown_future_field": 1}) == m


def test_memory_limit_flags_the_run():
    m = measure(short_spec(steps=2, memory_limit_bytes=1024**2), TrainConfig(token_budget=1024))
    assert m.outcome == "over_memory_limit"
    assert format_bytes(m.peak_memory_bytes) in m.reason and "1.00 MiB" in m.reason
    assert m.tokens_per_sec > 0  # measured all the same: the sampler learns from it
    # ... and a limit above the peak is ok.
    assert measure(short_spec(steps=2, memory_limit_bytes=1024**4), TrainConfig(token_budget=1024)).outcome == "ok"


def test_unsupported_config_is_an_outcome_without_running(monkeypatch):
    def must_not_build(name):
        raise AssertionError("an unsupported config must be rejected before building the model")

    monkeypatch.setattr(autotune.measure.loop, "build_model", must_not_build)
    m = measure(short_spec(), TrainConfig(sdpa_backend="efficient"))
    assert m.outcome == "unsupported"
    assert m.reason.startswith("sdpa_backend:")
    assert m.tokens_per_sec is None and m.device["kind"] == "cpu"


def test_backend_failing_at_run_time_is_unsupported(monkeypatch):
    # Skip the static rules: the forced kernel then fails inside the step, and the error is
    # still classified as unsupported (never retried), not as a crash.
    monkeypatch.setattr(autotune.measure.loop, "check_supported", lambda cfg, caps: None)
    m = measure(short_spec(steps=2), TrainConfig(sdpa_backend="efficient", token_budget=1024))
    assert m.outcome == "unsupported"
    assert m.reason.startswith("sdpa_backend:") and "No viable backend" in m.reason


def test_a_crash_inside_the_run_is_an_outcome(monkeypatch):
    def broken(name):
        model = build_model(name)

        def explode(x):
            raise ValueError("boom in block 1")

        model.transformer.h[1].forward = explode
        return model

    monkeypatch.setattr(autotune.measure.loop, "build_model", broken)
    m = measure(short_spec(steps=2), TrainConfig(token_budget=1024))
    assert m.outcome == "crashed"
    assert m.reason.startswith("ValueError: boom in block 1") and "explode" in m.reason  # with its traceback tail
    assert m.tokens_per_sec is None


def test_bad_input_is_raised_not_an_outcome():
    with pytest.raises(UsageError, match="longer than the model's context"):
        measure(short_spec(seq_len=256), TrainConfig())


def test_user_model_runs_with_checkpointing():
    m = measure(short_spec(model="tests.fixture_models:make_llama", steps=3),
                TrainConfig(token_budget=512, checkpoint_layers=(1,)))
    assert m.outcome == "ok", m.reason
    assert m.model["seq_len"] == 64 and m.model["vocab_size"] == 300 and m.model["n_layer"] == 2
    assert m.mfu is None and m.tokens_per_sec > 0


# --------------------------------------------------------------------------------- MFU


@pytest.mark.parametrize(
    "name, dtype, flops",
    [
        ("NVIDIA H200", "bfloat16", 989e12),
        ("NVIDIA H100 80GB HBM3", "bfloat16", 989e12),
        ("NVIDIA H100 80GB HBM3", "tf32", 494.5e12),
        ("NVIDIA H100 PCIe", "bfloat16", 756e12),  # PCIe is listed before the SXM fragment "H100"
        ("NVIDIA A100-SXM4-80GB", "bfloat16", 312e12),
        ("NVIDIA A100-SXM4-80GB", "float32", 19.5e12),
        ("NVIDIA A100-PCIE-40GB", "float16", 312e12),
        ("Tesla V100-SXM2-16GB", "bfloat16", None),  # no bfloat16 on Volta
        ("AMD EPYC 7B13", "bfloat16", None),
        ("Some Future GPU", "float16", None),
    ],
)
def test_peak_flops_lookup(name, dtype, flops):
    assert peak_flops(name, dtype) == flops


def test_peak_flops_table_cites_sources():
    assert all(source for _, _, source in PEAK_FLOPS)


class Shaped:
    """A model's MFU inputs, as the measuring loop reads them (built on the meta device)."""

    def __init__(self, device_name: str, amp_dtype: str = "bfloat16", kind: str = "cuda", model: str = "gpt2") -> None:
        self.info = DeviceInfo(kind=kind, name=device_name, compute_capability="9.0" if kind == "cuda" else None)
        self.amp_dtype = amp_dtype
        with torch.device("meta"):
            built = build_model(model)
        self.shape = model_shape(built)
        self.n_params = non_embedding_params(built)

    def mfu(self, tokens_per_sec: float, width: float) -> float | None:
        return model_flops_utilization(tokens_per_sec, n_params=self.n_params, shape=self.shape, width=width,
                                       device=self.info, amp_dtype=self.amp_dtype)


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


# -------------------------------------------------------------------------- data waits


class SlowDataset:
    """Synthetic items, each taking `delay_s` to load: a starved input pipeline."""

    def __init__(self, inner, delay_s: float) -> None:
        self.inner, self.lengths, self.delay_s = inner, inner.lengths, delay_s

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(self.delay_s)
        return self.inner[i]


def test_data_waits_are_measured(monkeypatch):
    delay = 0.02

    def slow(data, *, vocab_size, seq_len, seed):
        inner = make_dataset("synthetic", vocab_size=vocab_size, seq_len=seq_len, seed=seed, min_tokens=seq_len * 512)
        return SlowDataset(inner, delay)

    cfg = TrainConfig(batching="fixed", token_budget=1024)  # 8 items, so >= 160 ms of waiting per step
    fast = measure(short_spec(steps=3), cfg)
    monkeypatch.setattr(autotune.measure.loop, "make_dataset", slow)
    starved = measure(short_spec(steps=3), cfg)
    assert fast.outcome == starved.outcome == "ok"

    def wait_per_step(m: Measurement) -> float:
        wall = 8 * 128 * m.steps * (1 - m.padding_fraction) / m.tokens_per_sec  # fixed: 8 x 128 per step
        return m.data_wait_fraction * wall / m.steps

    # Sleeping is a lower bound of the wait, whatever the load on the machine: 8 items per step.
    sleep = 8 * delay
    assert wait_per_step(starved) >= sleep * 0.99
    # In-process synthetic items cost well under a millisecond each (a few even on a loaded box).
    assert wait_per_step(fast) < sleep / 4
    assert starved.data_wait_fraction > fast.data_wait_fraction
    assert fast.data_wait_fraction < 0.5
    # A step is timed mark to mark, its wait for the batch included.
    assert starved.step_time_median_s > sleep


def test_the_timed_window_lasts_at_least_min_time():
    """On a fast device --steps alone gives a window too short to reproduce: the loop keeps
    stepping until both the step count and the minimum time are reached."""
    short = measure(RunSpec(model="gpt2-tiny", device="cpu", warmup=1, steps=2, min_time_s=0),
                    TrainConfig(token_budget=1024))
    timed = measure(RunSpec(model="gpt2-tiny", device="cpu", warmup=1, steps=2, min_time_s=0.8),
                    TrainConfig(token_budget=1024))
    assert short.steps in (2, 4)  # 4 when the CV check took a second window
    assert timed.steps > short.steps
    assert timed.phase_s["timed"] >= 0.8


def test_min_time_must_not_be_negative():
    with pytest.raises(UsageError, match="min_time_s must be a number of seconds >= 0"):
        RunSpec(min_time_s=-1)
