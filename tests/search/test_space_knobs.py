"""The shipped spaces with the new knobs, and the space format's checkpoint counts written
against the model's depth (partial counts only for deep models)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import optuna
import pytest
from optuna.trial import FixedTrial

from autotune.config import TrainConfig
from autotune.errors import UnsupportedConfig, UsageError
from autotune.knobs.support import DeviceCapabilities, check_supported
from autotune.space.file import load_space
from autotune.space.sampling import params_for, suggest

# One pytest-xdist worker runs this module, so that its module-scoped sample of 400 GPU-space trials (gpu_trials)
# is made once, not in each worker.
pytestmark = pytest.mark.xdist_group("space-knobs")
ROOT = Path(__file__).resolve().parents[2]
GPT2_SPACE, CPU_SPACE = ROOT / "search_spaces" / "gpt2.yaml", ROOT / "search_spaces" / "cpu.yaml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def sampled(space, n: int = 300, seed: int = 0) -> list[tuple[dict, TrainConfig]]:
    """(params asked, configuration) of `n` random trials; a combination the registry refuses
    (CUDA graphs with padded batches) is no configuration, as in `space.enumerate`."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    out = []
    for _ in range(n):
        trial = study.ask()
        try:
            cfg = suggest(space, trial)
        except UsageError:
            continue
        out.append((dict(trial.params), cfg))
    return out


# --- checkpoint counts against the depth ------------------------------------------------------


@pytest.mark.parametrize(
    "n_layer, counts",
    [(12, (0, 12)), (24, (0, 6, 12, 18, 24)), (36, (0, 9, 18, 27, 36)), (48, (0, 12, 24, 36, 48))],
)
@pytest.mark.slow
def test_gpt2_space_checkpoints_none_or_all_unless_deep(n_layer, counts):
    space = load_space(GPT2_SPACE, n_layer=n_layer, seq_len=1024)
    assert space.checkpoint.count.choices == counts
    layers = {cfg.checkpoint_layers for _, cfg in sampled(space, 200)}
    if n_layer == 12:  # GPT-2 124M: nothing or everything, never a placement
        assert layers == {(), tuple(range(12))}
    else:
        assert any(0 < len(ls) < n_layer for ls in layers)


def test_placement_asked_for_partial_counts_only(tmp_path):
    space = load_space(
        write(
            tmp_path,
            "dimensions:\n  checkpoint:\n    count: {choices: [0, n_layer/2, n_layer]}\n"
            "    placement: {choices: [first, last]}\n",
        ),
        n_layer=8,
    )
    assert space.checkpoint.count.choices == (0, 4, 8)
    for params, cfg in sampled(space, 60):
        partial = 0 < len(cfg.checkpoint_layers) < 8
        assert ("checkpoint_placement" in params) == partial
        assert suggest(space, FixedTrial(params_for(space, cfg))) == cfg  # warm starts round-trip


@pytest.mark.parametrize(
    "count, message",
    [
        (
            "{choices: [0, n_layers]}",
            "'n_layers' is not a block count: expected an integer >= 0, n_layer, n_layer/K or M*n_layer/K",
        ),
        ("{choices: [0, 5*n_layer/4]}", "'5*n_layer/4': the fraction of n_layer must be above 0 and at most 1"),
        ("{choices: [0, n_layer/0]}", "'n_layer/0': the fraction of n_layer must be above 0 and at most 1"),
        ("{choices: [0, -1]}", "-1 is not a block count"),
        (
            "{choices: [0, n_layer], partial_when: {num_workers: 1}}",
            "expected a condition on n_layer, e.g. {n_layer: {ge: 24}}",
        ),
        (
            "{choices: [0, n_layer], partial_when: {n_layer: {above: 3}}}",
            "expected operators from gt, ge, lt, le with integers",
        ),
        ("{low: 0, high: n_layer, partial_when: {n_layer: {ge: 24}}}", "goes with count choices, not low and high"),
    ],
)
def test_bad_counts_name_the_key(tmp_path, count, message):
    path = write(tmp_path, f"dimensions:\n  checkpoint:\n    count: {count}\n")
    with pytest.raises(UsageError) as info:
        load_space(path, n_layer=12)
    assert str(info.value).startswith(f"search space {path}: dimensions.checkpoint.count")
    assert message in str(info.value)


def test_a_partial_count_is_outside_a_none_or_all_space():
    """Warm starts from a study that checkpointed 3 of 12 blocks do not enter the 124M space."""
    space = load_space(GPT2_SPACE, n_layer=12, seq_len=1024)
    cfg = TrainConfig(batching="packed", amp_dtype="bfloat16", sdpa_backend="flash", token_budget=65536)
    assert params_for(space, cfg.replace(checkpoint_layers=tuple(range(12))))["checkpoint_count"] == 12
    assert params_for(space, cfg.replace(checkpoint_layers=(0, 1, 2))) is None


def test_unbound_space_keeps_depth_counts_as_written(tmp_path):
    path = write(tmp_path, "dimensions:\n  checkpoint:\n    count: {choices: [0, n_layer/2, n_layer]}\n")
    assert load_space(path).checkpoint.count.choices == (0, "n_layer/2", "n_layer")


# --- the GPU space -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpu_trials():
    return sampled(load_space(GPT2_SPACE, n_layer=12, seq_len=1024), 400)


def test_gpu_space_searches_packed_and_every_new_knob(gpu_trials):
    configs = [cfg for _, cfg in gpu_trials]
    assert {c.batching for c in configs} == {"padded", "packed"}
    assert {c.attention_mask for c in configs if c.batching == "packed"} == {"causal", "document"}
    assert {c.compile_scope for c in configs if c.compile_mode != "none"} == {"blocks", "blocks+head", "model"}
    assert {c.loss_impl for c in configs} == {"standard", "chunked"}
    assert {c.expandable_segments for c in configs if c.batching == "padded"} == {False, True}
    assert {c.compile_mode for c in configs} >= {"max-autotune", "max-autotune-no-cudagraphs"}


def test_gpu_space_conditions(gpu_trials):
    for params, cfg in gpu_trials:
        # The SDPA backend is searched for causal attention only (document masks run
        # FlexAttention) -- a condition on a knob padded trials never set, seen at its default.
        assert ("sdpa_backend" in params) == (cfg.attention_mask == "causal"), params
        assert ("attention_mask" in params) == (cfg.batching == "packed")
        assert ("compile_scope" in params) == (cfg.compile_mode != "none")


def test_gpu_space_autotuning_and_cuda_graphs_only_with_static_shapes():
    space = load_space(GPT2_SPACE, n_layer=12, seq_len=1024)
    base = TrainConfig(amp_dtype="bfloat16", sdpa_backend="flash", token_budget=65536)
    for mode in ("max-autotune", "reduce-overhead"):  # CUDA graphs: the registry refuses padded batches
        with pytest.raises(UsageError, match=f"compile_mode={mode} replays CUDA graphs"):
            base.replace(compile_mode=mode, batching="padded")
    no_graphs = base.replace(compile_mode="max-autotune-no-cudagraphs", batching="padded")  # the space's own rule
    assert space.violation(no_graphs).startswith("compile_mode:")
    for mode in ("max-autotune", "max-autotune-no-cudagraphs", "reduce-overhead"):
        assert space.violation(base.replace(compile_mode=mode, batching="packed")) is None
    assert space.violation(base.replace(compile_mode="default", batching="padded")) is None


def test_gpu_space_holds_the_strongest_configuration():
    space = load_space(GPT2_SPACE, n_layer=12, seq_len=1024)
    strong = TrainConfig(
        num_workers=4,
        prefetch_factor=4,
        persistent_workers=True,
        pin_memory=True,
        token_budget=65536,
        batching="packed",
        amp_dtype="bfloat16",
        compile_mode="max-autotune-no-cudagraphs",
        compile_scope="model",
        loss_impl="chunked",
        sdpa_backend="cudnn",
    )
    params = params_for(space, strong)
    assert params is not None and space.violation(strong) is None
    assert suggest(space, FixedTrial(params)) == strong


# --- the CPU space -----------------------------------------------------------------------------


@pytest.mark.slow
def test_cpu_space_holds_only_what_a_cpu_runs():
    space = load_space(CPU_SPACE, n_layer=2, seq_len=128)
    configs = [cfg for _, cfg in sampled(space, 300)]
    for cfg in configs:
        try:
            check_supported(cfg, DeviceCapabilities("cpu"))
        except UnsupportedConfig as exc:  # pragma: no cover - the failure message
            pytest.fail(f"{cfg}: {exc}")
    assert {c.batching for c in configs} == {"padded", "packed"}
    assert {c.loss_impl for c in configs} == {"standard", "chunked"}
    assert {c.compile_scope for c in configs if c.compile_mode != "none"} == {"blocks", "blocks+head", "model"}
