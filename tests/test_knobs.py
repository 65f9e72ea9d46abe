"""Every model-side knob really takes effect: each test observes the knob's effect (the
kernel that ran, tensors saved for backward, dtypes, compiled graphs, batch shapes), not
just that a field was stored. DataLoader knobs: see also tests/test_data.py
(test_workers_are_processes_and_persistence_keeps_them, test_prefetch_and_pin_memory_reach_the_loader)."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import torch

from autotune.config import RunSpec, TrainConfig
from autotune.data.batching import build_dataloader
from autotune.data.datasets import make_dataset
from autotune.errors import UnsupportedConfig, UsageError
from autotune.knobs.apply import apply_model_knobs
from autotune.knobs.checkpoint import apply_activation_checkpointing, is_checkpointed
from autotune.knobs.compile import apply_compile, is_compiled
from autotune.knobs.precision import grad_scaler, precision, training_context
from autotune.knobs.support import DeviceCapabilities, check_supported
from autotune.measure.loop import measure
from autotune.measure.outcomes import is_sdpa_unsupported_error
from autotune.model.introspect import find_blocks
from autotune.model.load import build_model

CPU = DeviceCapabilities(kind="cpu")
HOPPER = DeviceCapabilities(kind="cuda", compute_capability=(9, 0))
TURING = DeviceCapabilities(kind="cuda", compute_capability=(7, 5))

MATH_OP = "aten::_scaled_dot_product_attention_math"
FLASH_OP = "aten::_scaled_dot_product_flash_attention_for_cpu"


def tiny(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model("gpt2-tiny")


def batch(width: int = 48, rows: int = 2, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 320, (rows, width), generator=g)
    return x, torch.roll(x, -1, dims=1)


def compiled_graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


# ------------------------------------------------------------------------ sdpa_backend


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
    "knobs, knob",
    [
        ({"sdpa_backend": "efficient"}, "sdpa_backend"),
        ({"sdpa_backend": "cudnn"}, "sdpa_backend"),
        ({"pin_memory": True}, "pin_memory"),
        ({"amp_dtype": "tf32"}, "amp_dtype"),
        ({"compile_mode": "reduce-overhead"}, "compile_mode"),
    ],
)
def test_cpu_rejects_cuda_only_knobs(knobs, knob):
    with pytest.raises(UnsupportedConfig) as info:
        check_supported(TrainConfig(**knobs), CPU)
    assert info.value.knob == knob and str(info.value).startswith(f"{knob}: ")


@pytest.mark.parametrize(
    "knobs", [{}, {"sdpa_backend": "math"}, {"sdpa_backend": "flash"}, {"amp_dtype": "bfloat16"},
              {"amp_dtype": "float16"}, {"compile_mode": "default"}, {"checkpoint_layers": (0,)}]
)
def test_cpu_accepts_what_it_can_run(knobs):
    check_supported(TrainConfig(**knobs), CPU)


def test_cuda_flash_needs_half_precision():
    with pytest.raises(UnsupportedConfig) as info:
        check_supported(TrainConfig(sdpa_backend="flash", amp_dtype="float32"), HOPPER)
    assert info.value.knob == "sdpa_backend" and "float32" in str(info.value)
    check_supported(TrainConfig(sdpa_backend="flash", amp_dtype="bfloat16"), HOPPER)
    check_supported(TrainConfig(sdpa_backend="efficient", amp_dtype="float32"), HOPPER)
    check_supported(TrainConfig(amp_dtype="tf32", compile_mode="reduce-overhead", pin_memory=True,
                                num_workers=1), HOPPER)


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


# ------------------------------------------------------------------- checkpoint_layers


def saved_for_backward(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[int, torch.Tensor]:
    """How many tensors autograd keeps for backward during one forward, and the loss."""
    count = 0

    def pack(t):
        nonlocal count
        count += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(x, y)
    return count, loss


def test_checkpointing_saves_fewer_tensors_per_block():
    base = tiny()
    x, y = batch()
    counts = {}
    for layers in [(), (0,), (0, 1)]:
        model = copy.deepcopy(base)
        apply_activation_checkpointing(model, layers)
        assert [is_checkpointed(b) for b in find_blocks(model)] == [i in layers for i in range(2)]
        counts[layers] = saved_for_backward(model, x, y)[0]
    assert counts[()] > counts[(0,)] > counts[(0, 1)]
    # The two blocks are identical: each checkpointed block saves the same amount less.
    assert counts[()] - counts[(0,)] == counts[(0,)] - counts[(0, 1)]


def test_checkpointing_keeps_state_dict_and_numerics():
    base = tiny()
    model = copy.deepcopy(base)
    apply_activation_checkpointing(model, (0, 1))
    assert list(model.state_dict()) == list(base.state_dict())
    model.load_state_dict(base.state_dict())  # a user's checkpoint still loads
    x, y = batch()
    loss_a, loss_b = base(x, y), model(x, y)
    loss_a.backward()
    loss_b.backward()
    torch.testing.assert_close(loss_b, loss_a)
    for (name, p), q in zip(base.named_parameters(), model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, msg=name)


def test_checkpointed_recomputation_uses_the_forced_backend():
    """Backward runs outside training_context; the recomputed forward of a checkpointed
    block must still use the forced kernel (else its saved tensors differ and checkpoint
    raises, or the trial silently measures another kernel)."""
    model = tiny()
    apply_activation_checkpointing(model, (0, 1))
    x, y = batch()
    with training_context("cpu", TrainConfig(sdpa_backend="math")):
        loss = model(x, y)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        loss.backward()  # the flags are back to "any backend" here: flash would be picked
    ops = {e.name for e in prof.events() if "attention" in e.name}
    assert MATH_OP in ops and FLASH_OP not in ops
    assert torch.backends.cuda.flash_sdp_enabled()  # and the forced choice did not leak out


def test_checkpointing_is_idempotent():
    model = tiny()
    apply_activation_checkpointing(model, (0,))
    forward = find_blocks(model)[0].forward
    apply_activation_checkpointing(model, (0,))
    assert find_blocks(model)[0].forward is forward  # not wrapped twice (recomputing twice)


def test_checkpoint_index_beyond_the_blocks_is_rejected():
    with pytest.raises(UsageError, match=r"block 2 does not exist, the model has 2 blocks \(0\.\.1\)"):
        apply_activation_checkpointing(tiny(), (0, 2))


def test_checkpointing_a_llama_style_user_model():
    base = build_model("tests.fixture_models:make_llama")
    x = torch.randint(0, 300, (2, 32))
    plain = saved_for_backward(base, x, x)
    model = copy.deepcopy(base)
    apply_activation_checkpointing(model, (1,))  # found at model.layers; layers take kwargs
    assert is_checkpointed(model.model.layers[1]) and not is_checkpointed(model.model.layers[0])
    checkpointed = saved_for_backward(model, x, x)
    assert checkpointed[0] < plain[0]
    torch.testing.assert_close(checkpointed[1], plain[1])


def test_explicit_block_path():
    model = build_model("tests.fixture_models:make_odd_path")
    with pytest.raises(UsageError, match="block_path="):
        apply_activation_checkpointing(model, (0,))  # backbone.stack is not a guessable path
    x = torch.randint(0, 300, (2, 32))
    before = saved_for_backward(model, x, x)[0]
    apply_activation_checkpointing(model, (0, 1), block_path="backbone.stack")
    assert all(is_checkpointed(b) for b in model.backbone.stack)
    assert saved_for_backward(model, x, x)[0] < before
    with pytest.raises(UsageError, match="names nothing"):
        find_blocks(model, "backbone.missing")
    with pytest.raises(UsageError, match="names Module"):
        find_blocks(model, "backbone")


# ----------------------------------------------------------------------------- amp_dtype


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


def test_tf32_is_set_inside_and_restored_after():
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    saved = (matmul.allow_tf32, cudnn.allow_tf32)
    try:
        matmul.allow_tf32 = cudnn.allow_tf32 = False
        with precision("cuda", "tf32"):
            assert matmul.allow_tf32 and cudnn.allow_tf32
        assert not matmul.allow_tf32 and not cudnn.allow_tf32
        with pytest.raises(KeyError):  # restored on an error too
            with precision("cuda", "tf32"):
                raise KeyError("boom")
        assert not matmul.allow_tf32 and not cudnn.allow_tf32
        with precision("cpu", "float32"):
            assert not matmul.allow_tf32  # float32 means full float32 matmuls
    finally:
        matmul.allow_tf32, cudnn.allow_tf32 = saved


# --------------------------------------------------------------------------- compile_mode
# torch.compile on 2 CPU cores costs tens of seconds per new graph (inductor then caches it
# under /tmp): these are the suite's only two compile tests.


def test_compile_none_leaves_blocks_eager():
    model = tiny()
    apply_model_knobs(model, TrainConfig(compile_mode="none"))
    assert not any(is_compiled(b) for b in find_blocks(model))
    before = compiled_graphs()
    x, y = batch()
    model(x, y).backward()
    assert compiled_graphs() == before


COMPILE_RUN_CFG = TrainConfig(compile_mode="default", batching="padded", token_budget=1024)


def first_measured_shape(cfg: TrainConfig) -> tuple[int, int]:
    """(rows, width) of the first batch measure() steps on for gpt2-tiny, seed 0."""
    dataset = make_dataset("synthetic", vocab_size=320, seq_len=128, seed=0)
    x, _ = next(iter(build_dataloader(dataset, cfg, seq_len=128, seed=0)))
    return tuple(x.shape)


@pytest.mark.compile
def test_compile_compiles_each_block_and_runs_compiled_graphs(fresh_dynamo):
    eager = tiny()
    model = copy.deepcopy(eager)
    apply_compile(model, "default")
    assert all(is_compiled(b) for b in find_blocks(model))
    assert not is_compiled(model)  # per block: embedding, head and loss stay eager
    assert list(model.state_dict()) == list(eager.state_dict())
    before = compiled_graphs()
    # The shape the compiled measure() run below starts with: its first graph is then the
    # one compiled here, and inductor's cache pays for it once.
    x, y = batch(*reversed(first_measured_shape(COMPILE_RUN_CFG)))
    loss = model(x, y)
    loss.backward()
    # Identical blocks share one traced graph; dynamo really compiled something.
    assert compiled_graphs() - before == 1
    reference = eager(x, y)
    reference.backward()
    torch.testing.assert_close(loss, reference, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(model.transformer.h[0].attn.c_attn.weight.grad,
                               eager.transformer.h[0].attn.c_attn.weight.grad, rtol=1e-3, atol=1e-5)
    # The same shape again: no new graph.
    model(x, y).backward()
    assert compiled_graphs() - before == 1


@pytest.mark.compile
def test_compiled_padded_run_does_not_recompile_while_timed(fresh_dynamo, batch_record):
    """Padded batches vary in width; a compiled run must not recompile every step (that
    would time the compiler). Warm-up runs until dynamo has seen two widths and made the
    length dynamic, so the timed steps, with widths warm-up never saw, reuse the graph."""
    spec = RunSpec(model="gpt2-tiny", device="cpu", warmup=1, steps=6)
    m = measure(spec, COMPILE_RUN_CFG)
    assert m.outcome == "ok", m.reason
    assert batch_record.shapes[0] == first_measured_shape(COMPILE_RUN_CFG)
    warm = {w for _, w in batch_record.shapes[: m.warmup_steps]}
    timed = [w for _, w in batch_record.shapes[m.warmup_steps : m.warmup_steps + m.steps]]
    assert len(warm) >= 2 and m.warmup_steps >= 2  # the extra warm-up for shapes happened
    assert len(timed) == m.steps and set(timed) - warm, (warm, timed)  # new widths were timed
    assert m.recompiles_during_timing == 0
    assert m.compile_time_s > 0
    assert m.config["compile_mode"] == "default"


# ------------------------------------------------------------- token_budget and batching


@pytest.fixture
def small_data(monkeypatch):
    """A smaller synthetic corpus (64k tokens, the same length distribution): packed mode
    materializes its stream, which at the default size costs seconds."""

    def dataset(data, *, vocab_size, seq_len, seed):
        return make_dataset(data, vocab_size=vocab_size, seq_len=seq_len, seed=seed, min_tokens=seq_len * 512)

    monkeypatch.setattr("autotune.measure.loop.make_dataset", dataset)


def run_small(batch_record, **knobs):
    batch_record.clear()
    m = measure(RunSpec(model="gpt2-tiny", device="cpu", warmup=1, steps=2), TrainConfig(**knobs))
    assert m.outcome == "ok", m.reason
    return m, list(batch_record.shapes)


def test_token_budget_sets_the_tokens_of_each_step(batch_record, small_data):
    _, small = run_small(batch_record, batching="fixed", token_budget=1024)
    _, large = run_small(batch_record, batching="fixed", token_budget=4096)
    assert set(small) == {(8, 128)}  # 1024 // 128 full-width rows
    assert set(large) == {(32, 128)}
    _, padded = run_small(batch_record, batching="padded", token_budget=1024)
    assert all(rows * width <= 1024 for rows, width in padded)
    assert max(rows * width for rows, width in padded) > 1024 - 128  # the budget is filled


def test_batching_mode_sets_the_padding(batch_record, small_data):
    fixed, fixed_shapes = run_small(batch_record, batching="fixed", token_budget=1024)
    padded, padded_shapes = run_small(batch_record, batching="padded", token_budget=1024)
    packed, packed_shapes = run_small(batch_record, batching="packed", token_budget=1024)
    assert set(fixed_shapes) == set(packed_shapes) == {(8, 128)}  # full context rows
    assert min(width for _, width in padded_shapes) < 128  # padded to the batch's longest only
    assert packed.padding_fraction == 0.0
    assert padded.padding_fraction > 0 and fixed.padding_fraction > padded.padding_fraction
    # Synthetic documents have a median of a quarter context: fixed-width rows are mostly pad.
    assert fixed.padding_fraction > 0.5
    for m in (fixed, padded, packed):
        # effective = padded throughput * non-pad share: the two rates agree with the fraction.
        assert m.tokens_per_sec == pytest.approx(m.padded_tokens_per_sec * (1 - m.padding_fraction))


# ----------------------------------------------------------------------- DataLoader knobs


class PidLoggingDataset:
    """Synthetic items; each load appends the loading process's pid to a file."""

    def __init__(self, inner, log_path: Path) -> None:
        self.inner, self.lengths, self.log_path = inner, inner.lengths, log_path

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: int) -> torch.Tensor:
        with open(self.log_path, "a") as f:
            f.write(f"{os.getpid()}\n")
        return self.inner[i]


def test_measure_loads_data_in_worker_processes(batch_record, monkeypatch, tmp_path):
    log = tmp_path / "pids"

    def dataset(data, *, vocab_size, seq_len, seed):
        return PidLoggingDataset(make_dataset("synthetic", vocab_size=vocab_size, seq_len=seq_len, seed=seed,
                                              min_tokens=seq_len * 512), log)

    monkeypatch.setattr("autotune.measure.loop.make_dataset", dataset)
    cfg = TrainConfig(num_workers=2, prefetch_factor=3, persistent_workers=True, token_budget=1024)
    m = measure(RunSpec(model="gpt2-tiny", device="cpu", warmup=1, steps=3), cfg)
    assert m.outcome == "ok", m.reason
    (loader,) = batch_record.loaders
    assert (loader.num_workers, loader.prefetch_factor, loader.persistent_workers, loader.pin_memory) == (2, 3, True, False)
    pids = {int(line) for line in log.read_text().split()}
    assert os.getpid() not in pids and len(pids) == 2  # the items were loaded by two workers


def test_measure_loads_in_process_without_workers(monkeypatch, tmp_path):
    log = tmp_path / "pids"
    monkeypatch.setattr(
        "autotune.measure.loop.make_dataset",
        lambda data, *, vocab_size, seq_len, seed: PidLoggingDataset(
            make_dataset("synthetic", vocab_size=vocab_size, seq_len=seq_len, seed=seed, min_tokens=seq_len * 512), log),
    )
    m = measure(RunSpec(model="gpt2-tiny", device="cpu", warmup=1, steps=2), TrainConfig(token_budget=1024))
    assert m.outcome == "ok", m.reason
    assert {int(line) for line in log.read_text().split()} == {os.getpid()}
