"""What an expert knows before measuring anything, as priors the measurements can overturn:

- throughput: each knob value's effect on log tokens/s, per device class, with how sure we are
  (`THROUGHPUT`); the token budget's saturation (`budget_saturation`); checkpointing's recompute;
- memory: an analytic peak for any configuration, `static + per_token x budget`, from the model's
  shape (`analytic_memory`): weights, gradients and AdamW state; activations per token by dtype,
  attention kernel and checkpointed blocks; the logits; compile's and CUDA graphs' extras;
- cost: the seconds a trial takes, by compile mode (`trial_seconds`).

Every figure is a starting point, not a verdict: `search.throughput_model` and
`search.memory_model` fit corrections to every measured trial. The sources are given beside each.
Torch-free."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from autotune.model.sizes import MODEL_SIZES, ModelDims

GiB = 2**30

# --- device classes ------------------------------------------------------------------------------

CPU, CUDA_OLD, CUDA_AMPERE, CUDA_HOPPER = "cpu", "cuda-pre-ampere", "cuda-ampere", "cuda-hopper"


def device_class(kind: str, compute_capability: tuple[int, int] | None) -> str:
    if kind == "cpu":
        return CPU
    major = compute_capability[0] if compute_capability else 8  # unknown: a GPU of today, not a Volta
    if major >= 9:
        return CUDA_HOPPER
    return CUDA_AMPERE if major >= 8 else CUDA_OLD


# --- throughput ----------------------------------------------------------------------------------
# knob -> value -> (mean, sd) of its effect on log tokens/s, relative to the first value listed
# as 0. A knob or value not listed: mean 0, sd UNKNOWN_SD (a knob of a user's or a new one).
UNKNOWN_SD = 0.15

_CUDA_COMMON: dict[str, dict[Any, tuple[float, float]]] = {
    # bf16 tensor cores: fp16 the same speed less the GradScaler's step; TF32 about half of bf16
    # on matmuls; fp32 without tensor cores 8-16x slower (A100/H100 datasheets: 19.5 vs 312 TFLOP/s).
    "amp_dtype": {"bfloat16": (0.0, 0.05), "float16": (-0.02, 0.05), "tf32": (-0.6, 0.3), "float32": (-1.8, 0.5)},
    # FlashAttention-2 (Dao 2023); memory-efficient attention slower; math materializes T x T scores.
    "sdpa_backend": {
        "flash": (0.0, 0.05),
        "cudnn": (0.0, 0.08),
        "auto": (-0.02, 0.05),
        "efficient": (-0.08, 0.08),
        "math": (-0.35, 0.2),
    },
    # Compile fuses elementwise and norm kernels: ~1.2-1.5x on GPT-2 (nanoGPT, modded-nanogpt);
    # max-autotune a few percent more; CUDA graphs help where launches dominate (small batches).
    "compile_mode": {
        "default": (0.0, 0.05),
        "none": (-0.25, 0.12),
        "max-autotune-no-cudagraphs": (0.02, 0.04),
        "max-autotune": (0.02, 0.04),
        "reduce-overhead": (0.0, 0.05),
    },
    # The head and loss (31 % of GPT-2 124M's matmul FLOPs) fused with the blocks, or the whole graph.
    "compile_scope": {"blocks+head": (0.0, 0.04), "model": (0.0, 0.04), "blocks": (-0.04, 0.04)},
    # Packed: no pads, one static shape; padded wastes ~8 % of positions; fixed pads to the context.
    "batching": {"packed": (0.0, 0.04), "padded": (-0.09, 0.05), "fixed": (-0.7, 0.3)},
    "loss_impl": {"standard": (0.0, 0.05), "chunked": (-0.02, 0.06)},  # a loop over chunks: a little slower
    "attention_mask": {"causal": (0.0, 0.03), "document": (-0.05, 0.05)},
    "expandable_segments": {False: (0.0, 0.01), True: (0.0, 0.01)},
}
_CPU: dict[str, dict[Any, tuple[float, float]]] = {
    # Without bf16 units a CPU emulates bf16 (1.5-10x slower); with them, about float32's speed.
    "amp_dtype": {"float32": (0.0, 0.05), "bfloat16": (-0.3, 0.4), "float16": (-0.5, 0.4)},
    "sdpa_backend": {"flash": (0.0, 0.1), "auto": (0.0, 0.1), "math": (-0.1, 0.15)},
    "compile_mode": {"none": (0.0, 0.1), "default": (0.0, 0.2)},
    "compile_scope": {"blocks": (0.0, 0.08), "blocks+head": (0.0, 0.08), "model": (0.0, 0.08)},
    "batching": {"packed": (0.0, 0.08), "padded": (-0.08, 0.08), "fixed": (-0.5, 0.3)},
    "loss_impl": {"standard": (0.0, 0.08), "chunked": (0.0, 0.08)},
    "attention_mask": {"causal": (0.0, 0.05), "document": (-0.05, 0.1)},
}
# DataLoader knobs: they matter only when the loop waits for data. Their sd is LOADER_SD_WAITING
# once a measurement says it waited (data_wait_fraction above DATA_WAIT), else LOADER_SD.
LOADER_SD, LOADER_SD_UNKNOWN, LOADER_SD_WAITING = 0.01, 0.03, 0.15
DATA_WAIT = 0.03
_LOADER_MEANS = {"num_workers": lambda v: -0.03 if v == 0 else 0.0, "pin_memory": lambda v: 0.0 if v else -0.005}

THROUGHPUT = {CPU: _CPU, CUDA_OLD: _CUDA_COMMON, CUDA_AMPERE: _CUDA_COMMON, CUDA_HOPPER: _CUDA_COMMON}
# Before Ampere there is no bf16: fp16 is the half precision that runs.
_PRE_AMPERE = {"amp_dtype": {"float16": (0.0, 0.05), "float32": (-1.2, 0.5), "bfloat16": (-1.0, 0.5)}}
# cuDNN attention on Hopper: up to 75 % faster than FlashAttention-2 (PyTorch 2.5 release notes).
_HOPPER = {"sdpa_backend": {"cudnn": (0.03, 0.06)}}


def knob_prior(device: str, knob: str, value: Any) -> tuple[float, float]:
    """(mean, sd) of a knob value's effect on log tokens/s."""
    table: dict[str, dict[Any, tuple[float, float]]] = {k: dict(v) for k, v in THROUGHPUT[device].items()}
    for override in ((_PRE_AMPERE,) if device == CUDA_OLD else ()) + ((_HOPPER,) if device == CUDA_HOPPER else ()):
        for k, values in override.items():
            table.setdefault(k, {}).update(values)
    if knob in _LOADER_MEANS:
        return _LOADER_MEANS[knob](value), LOADER_SD_UNKNOWN
    return table.get(knob, {}).get(value, (0.0, UNKNOWN_SD))


# Throughput rises with the micro-batch until the device saturates: tokens/s ~ b / (b + b_half)
# (a fixed per-step cost amortized over the batch: launches, the optimizer, the host). b_half: a
# few thousand tokens on a GPU for GPT-2 widths (the knee llm.c and nanoGPT batch sizes sit past).
BUDGET_HALF = {CPU: 256.0, CUDA_OLD: 4096.0, CUDA_AMPERE: 4096.0, CUDA_HOPPER: 8192.0}
BUDGET_CURVE_SD = 0.4  # on the curve's scale: measurements decide how much the budget matters
BUDGET_VALUE_SD = 0.04  # each budget's own deviation from the curve
# Checkpointing a block recomputes its forward: about a third more compute in it (Chen et al. 2016).
CHECKPOINT_COST = (-0.29, 0.1)  # log-effect of checkpointing every block (~ -log 1.33)


def budget_saturation(device: str, token_budget: int) -> float:
    half = BUDGET_HALF[device]
    return math.log(token_budget / (token_budget + half))


# --- memory ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryPrior:
    """Peak bytes = static + per_token x token_budget, with how sure the model is (sd of log peak)."""

    static: float
    per_token: float
    sd: float


# Korthikanti et al. 2022 ("Reducing Activation Recomputation"), eq. 1: a transformer layer keeps
# s*b*h*(34 + 5*a*s/h) bytes of 16-bit activations: 34 h per token, plus 5 a s for materialized
# attention scores (math attention only; flash, efficient and cuDNN keep none).
ACTIVATION_BYTES_PER_WIDTH = 34
SCORE_BYTES_PER_HEAD_POSITION = 5
# AdamW in mixed precision: fp32 weights, gradients and two moments (ZeRO, Rajbhandari et al. 2020).
STATE_BYTES_PER_PARAM = 16
# Standard loss: fp32 logits (tokens x vocab x 4 bytes), their softmax and gradient: ~2.5x.
LOGIT_BYTES_PER_ENTRY = 10
CUDA_CONTEXT = 0.5 * GiB  # context, cuBLAS/cuDNN workspaces
CPU_BASE = 280 * 2**20  # a Python process with torch imported, as its resident set
CPU_WORKER = 120 * 2**20  # each DataLoader worker process (its resident set, shared pages counted)
COMPILE_STATIC = {"none": 0.0, "default": 0.3 * GiB, "reduce-overhead": 0.5 * GiB}
AUTOTUNE_STATIC = 1.0 * GiB  # max-autotune benchmarks candidate kernels in workspaces of their own
CPU_COMPILE_STATIC = 300 * 2**20  # inductor's C++ compiler and its working set, in the trial's tree
PRIOR_SD = 0.35  # of log peak, before any measurement
GENERIC_WIDTH = {12: 768, 24: 1024, 36: 1280, 48: 1600}  # the GPT-2 family, when only the depth is known


def model_dims(model: str | None, n_layer: int | None, known: ModelDims | None = None) -> tuple[ModelDims, int, bool]:
    """(dims, heads, exact): the model's shape from what is known of it (its name, else its depth)."""
    if known is not None:
        return known, max(1, known.d_model // 64), True
    size = MODEL_SIZES.get(model or "")
    if size is not None:
        return ModelDims(size.n_layer, size.n_embd, size.vocab_size), size.n_head, True
    same_depth = [s for s in MODEL_SIZES.values() if s.n_layer == n_layer]
    if same_depth:  # a model of ours of that depth is the best guess of its shape
        s = same_depth[0]
        return ModelDims(s.n_layer, s.n_embd, s.vocab_size), s.n_head, False
    depth = n_layer or 12
    width = GENERIC_WIDTH.get(depth, 768)
    return ModelDims(depth, width, 50304), max(1, width // 64), False


def analytic_memory(
    knobs: Mapping[str, Any], *, device_kind: str, dims: ModelDims, heads: int, seq_len: int, exact: bool
) -> MemoryPrior:
    """The peak of a configuration before any measurement (the sources above)."""
    L, d, V = dims.n_layer, dims.d_model, dims.vocab_size
    n_params = 12 * L * d * d + V * d + seq_len * d
    dtype = knobs.get("amp_dtype", "float32")
    half = dtype in ("float16", "bfloat16")
    width_bytes = 1.0 if half else 2.0  # Korthikanti counts 16-bit activations; fp32 doubles them
    per_layer = ACTIVATION_BYTES_PER_WIDTH * d * width_bytes
    if knobs.get("sdpa_backend") == "math" and knobs.get("attention_mask", "causal") != "document":
        per_layer += SCORE_BYTES_PER_HEAD_POSITION * heads * seq_len * width_bytes
    compiled = knobs.get("compile_mode", "none") != "none"
    if compiled:
        per_layer *= 0.8  # fused elementwise kernels keep fewer intermediates
    checkpointed = len(knobs.get("checkpoint_layers") or ())
    kept = 2 * d * width_bytes  # a checkpointed block keeps its input only
    per_token = (L - checkpointed) * per_layer + checkpointed * kept
    if checkpointed:
        per_token += per_layer  # one block's activations live again while it is recomputed
    if knobs.get("loss_impl", "standard") == "standard":
        per_token += LOGIT_BYTES_PER_ENTRY * V
    mode = knobs.get("compile_mode", "none")
    if device_kind == "cpu":
        static = CPU_BASE + STATE_BYTES_PER_PARAM * n_params + CPU_WORKER * int(knobs.get("num_workers") or 0)
        static += CPU_COMPILE_STATIC if compiled else 0.0
        per_token *= 1.3  # the allocator's free lists and the process's own buffers
    else:
        static = CUDA_CONTEXT + STATE_BYTES_PER_PARAM * n_params + (2 * n_params if half else 0)
        static += AUTOTUNE_STATIC if mode.startswith("max-autotune") else COMPILE_STATIC.get(mode, 0.0)
        if mode in ("reduce-overhead", "max-autotune"):
            per_token *= 1.5  # CUDA graphs keep a private pool of the step's intermediates
    return MemoryPrior(float(static), float(per_token), PRIOR_SD if exact else 1.5 * PRIOR_SD)


# --- cost ------------------------------------------------------------------------------------------
# A trial's seconds: a process start (model build, data), compile in warm-up, the timed window.
PROCESS_S = {"cpu": 8.0, "cuda": 20.0}
TIMED_S = {"cpu": 4.0, "cuda": 5.0}
COMPILE_S = {"none": 0.0, "default": 60.0, "reduce-overhead": 90.0}
AUTOTUNE_S = 300.0  # max-autotune: minutes benchmarking kernel choices
# A graph compiled before in this study (the same knobs but the host-only ones) comes from
# inductor's on-disk caches: 105 s cold against 14 s warm for one CPU configuration here.
WARM_COMPILE = 0.25


def compile_seconds(knobs: Mapping[str, Any]) -> float:
    mode = knobs.get("compile_mode", "none")
    base = AUTOTUNE_S if mode.startswith("max-autotune") else COMPILE_S.get(mode, 60.0)
    return base * (1.5 if knobs.get("compile_scope") == "model" and mode != "none" else 1.0)
