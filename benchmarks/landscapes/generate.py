"""GPU-like benchmark landscapes from an analytic cost and memory model.

    python benchmarks/landscapes/generate.py [--out-dir benchmarks/landscapes] [--variant N]
                                             [--only NAME ...] [--check] [--no-write]

A landscape is a sweep in the format record_sweep.py writes (`format: autotune.sweep`,
version 2): every configuration of a search space (benchmarks/spaces/gpu_landscape.yaml,
enumerated by `_common.enumerate_space`) with an outcome, effective tokens/s, peak memory
as NVML would report it, a step-time CV, the data-wait and padding fractions a measurement
reports, and what running it as a trial costs (process + compile + timed seconds). No GPU
ran them: each figure comes from the model below, whose every constant is in FACTORS (with
the range a variant draws it from) or in DEVICES, and is explained in README.md beside this
file with the public figures it rests on.

The model, in one paragraph. A training step on a micro-batch of M positions costs GPU time
(block matmuls at the device's achievable tensor-core rate, discounted for narrow models and
small batches; attention by backend, math materialising the T x T scores; elementwise traffic
at HBM bandwidth, which torch.compile fuses; the head's matmul and its loss, fused only when
the head is in the compiled scope; checkpointed blocks recomputing their forward; fused
AdamW; launch gaps) and CPU time (eager dispatch or compiled-region calls, CUDA graph
replays; the main process's data loading with 0 workers), overlapped by a smooth maximum.
Effective tokens/s is non-pad tokens over the step. Peak memory is the CUDA context + 16
bytes per parameter (fp32 weights, grads, Adam) + the activations held at the worst point of
the backward (Korthikanti et al. 2022 per block, the checkpointed blocks keeping only their
input) + the logits phase of the loss + compile workspaces, CUDA graph pools and allocator
fragmentation. A configuration above the device's memory is `oom`; one that breaks a rule
of the space is `unsupported`, recorded as record_sweep.py records it.

`--variant N` (N >= 1) draws every factor from its range with a seeded RNG and writes
`<name>-vN.json.gz`: landscapes nobody tuned the search to. Everything is deterministic: the
same command writes the same bytes (the `created` field is the model's date, not the run's).
The summary printed after generating gives, for each landscape, the outcome counts and the
best configuration overall and under the 0.3/0.5/0.7/0.9 quantile memory limits (computed as
`_replay.memory_limit` computes them), with how many configurations lie within 3 % of it.

`load_landscape(path)` reads a `.json` or `.json.gz` landscape into the dict that
`_replay.Sweep.from_dict` takes. Standard library only, plus the repository's space loader
and `_common.enumerate_space`.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

HERE = Path(__file__).resolve().parent
BENCHMARKS = HERE.parent
if str(BENCHMARKS) not in sys.path:  # run as `python benchmarks/landscapes/generate.py`
    sys.path.insert(0, str(BENCHMARKS))

import _common  # noqa: E402  (puts the checkout on sys.path)
from _common import enumerate_space  # noqa: E402

try:  # the space loader moved in the package's refactor; either place will do
    from autotune.space.file import load_space  # noqa: E402
except ImportError:  # pragma: no cover - the layout before the move
    from autotune.search.space_file import load_space  # noqa: E402

from autotune.config import TrainConfig  # noqa: E402

SPACE_FILE = BENCHMARKS / "spaces" / "gpu_landscape.yaml"
SPACE_SOURCE = "benchmarks/spaces/gpu_landscape.yaml"
MODEL_VERSION = 1
MODEL_DATE = "2026-12-01T00:00:00+00:00"  # `created`: fixed, so that output is reproducible
QUANTILES = (0.3, 0.5, 0.7, 0.9)
TOLERANCE = 0.03  # "within 3 % of the best feasible", as _replay.TOLERANCE
MIB = 2**20
GIB = 2**30
# The measuring loop's defaults (autotune.config.RunSpec): the run every trial is.
RUN = {"steps": 20, "warmup": 3, "min_time_s": 2.0}
CV_TARGET = 0.05  # autotune.measure.loop: above it a second window is timed


# --------------------------------------------------------------------------- the devices


@dataclass(frozen=True)
class Device:
    """A GPU as the model sees it. Peaks are dense datasheet figures (autotune/device/flops.py);
    the efficiencies are what a PyTorch training step reaches, calibrated in README.md."""

    slug: str
    name: str  # as NVML names it
    total_memory_bytes: int
    compute_capability: str
    arch: str  # ampere | ada | hopper: which cuDNN-attention factor applies
    peak: Mapping[str, float]  # dense FLOP/s by amp_dtype
    hbm_bw: float  # bytes/s, datasheet
    mm_eff: float  # achievable fraction of the tensor-core peak on large GEMMs
    width_half: float  # model width at which the GEMMs of a block reach half of mm_eff
    knee_tokens: float  # micro-batch (at width 768) at which the block GEMMs fill half the GPU
    flash_eff: float  # FlashAttention-2 fwd+bwd, fraction of the 16-bit peak (head dim 64, causal)
    fp32_eff: float  # fp32 GEMMs on the CUDA cores (no TF32), fraction of the fp32 peak
    context_bytes: int  # CUDA context + cuBLAS/cuDNN handles, as NVML shows them
    cpu_speed: float  # host CPU time per dispatched op, relative to a server core (lower = faster)
    cpu: str
    cpu_count: int
    driver: str
    cuda: str

    def info(self) -> dict[str, Any]:
        """The `device` record, as autotune.device.info.DeviceInfo.to_dict() writes it."""
        return {
            "kind": "cuda",
            "name": self.name,
            "uuid": f"GPU-00000000-0000-0000-0000-{abs(hash_int(self.slug)) % 10**12:012d}",
            "index": 0,
            "total_memory_bytes": self.total_memory_bytes,
            "compute_capability": self.compute_capability,
            "driver": self.driver,
            "cuda": self.cuda,
            "torch": "2.13.0+cu128 (modelled)",
            "cpu_count": self.cpu_count,
        }


DEVICES: dict[str, Device] = {
    # 24 GB class. Ada: 165.2 TFLOP/s bf16/fp16 with fp32 accumulate (the whitepaper's dense
    # figure), 82.6 TF32 and 82.6 fp32 (the CUDA cores are strong on GeForce), 1.0 TB/s GDDR6X.
    # A desktop host: fast single-thread dispatch.
    "rtx4090": Device(
        "rtx4090",
        "NVIDIA GeForce RTX 4090",
        24564 * MIB,
        "8.9",
        "ada",
        {"bfloat16": 165.2e12, "float16": 165.2e12, "tf32": 82.6e12, "float32": 82.6e12},
        1.008e12,
        mm_eff=0.75,
        width_half=250,
        knee_tokens=1536,
        flash_eff=0.50,
        fp32_eff=0.65,
        context_bytes=420 * MIB,
        cpu_speed=0.8,
        cpu="AMD Ryzen 9 7950X (modelled)",
        cpu_count=32,
        driver="560.35.03",
        cuda="12.6",
    ),
    # A100 SXM: 312 dense bf16, 156 TF32, 19.5 fp32; 2.0 TB/s (80 GB) and 1.6 TB/s (40 GB).
    "a100-80gb": Device(
        "a100-80gb",
        "NVIDIA A100-SXM4-80GB",
        81920 * MIB,
        "8.0",
        "ampere",
        {"bfloat16": 312e12, "float16": 312e12, "tf32": 156e12, "float32": 19.5e12},
        2.039e12,
        mm_eff=0.80,
        width_half=420,
        knee_tokens=2048,
        flash_eff=0.50,
        fp32_eff=0.9,
        context_bytes=500 * MIB,
        cpu_speed=1.0,
        cpu="AMD EPYC 7763 (modelled)",
        cpu_count=32,
        driver="550.90.07",
        cuda="12.4",
    ),
    "a100-40gb": Device(
        "a100-40gb",
        "NVIDIA A100-SXM4-40GB",
        40960 * MIB,
        "8.0",
        "ampere",
        {"bfloat16": 312e12, "float16": 312e12, "tf32": 156e12, "float32": 19.5e12},
        1.555e12,
        mm_eff=0.80,
        width_half=420,
        knee_tokens=2048,
        flash_eff=0.50,
        fp32_eff=0.9,
        context_bytes=500 * MIB,
        cpu_speed=1.0,
        cpu="AMD EPYC 7742 (modelled)",
        cpu_count=32,
        driver="550.90.07",
        cuda="12.4",
    ),
    # H200 SXM: H100's tensor cores (989 dense bf16), 141 GB HBM3e at 4.8 TB/s. Hopper needs
    # larger tiles to fill 132 SMs, so narrow GEMMs and small batches lose more than on an
    # A100; FlashAttention-2 (torch's flash backend) uses neither wgmma nor TMA and reaches
    # about a third of the peak, which is why cuDNN's attention wins there.
    "h200": Device(
        "h200",
        "NVIDIA H200",
        143771 * MIB,
        "9.0",
        "hopper",
        {"bfloat16": 989e12, "float16": 989e12, "tf32": 494.5e12, "float32": 66.9e12},
        4.8e12,
        mm_eff=0.80,
        width_half=820,
        knee_tokens=6144,
        flash_eff=0.28,
        fp32_eff=0.75,
        context_bytes=560 * MIB,
        cpu_speed=0.9,
        cpu="Intel Xeon Platinum 8480+ (modelled)",
        cpu_count=32,
        driver="570.124.06",
        cuda="12.8",
    ),
}


@dataclass(frozen=True)
class Shape:
    """A GPT-2 model (autotune/model/sizes.py): context 1024, vocabulary 50304, tied head."""

    name: str
    n_layer: int
    n_embd: int
    n_head: int
    seq_len: int = 1024
    vocab: int = 50304

    @property
    def block_params(self) -> int:
        h = self.n_embd
        return self.n_layer * (12 * h * h + 13 * h)

    @property
    def params(self) -> int:
        h = self.n_embd
        return self.block_params + self.vocab * h + self.seq_len * h + 2 * h


SHAPES = {
    "gpt2": Shape("gpt2", 12, 768, 12),  # 124M
    "gpt2-medium": Shape("gpt2-medium", 24, 1024, 16),  # 355M
    "gpt2-xl": Shape("gpt2-xl", 48, 1600, 25),  # 1558M
}

# The canonical landscapes: (device, model). Memory binds on the 24 GB card (the best budget
# of gpt2-medium needs the chunked loss to fit) and for gpt2-xl on a 40 GB A100 (no budget fits
# without checkpointing); it does not bind for gpt2 on the H200 (every budget up to 131072
# fits with the standard loss and no checkpointing).
LANDSCAPES: list[tuple[str, str]] = [
    ("rtx4090", "gpt2"),
    ("rtx4090", "gpt2-medium"),
    ("a100-80gb", "gpt2"),
    ("a100-80gb", "gpt2-medium"),
    ("a100-40gb", "gpt2-xl"),
    ("h200", "gpt2"),
    ("h200", "gpt2-medium"),
    ("h200", "gpt2-xl"),
]


# --------------------------------------------------------------------------- the factors


@dataclass(frozen=True)
class Factor:
    default: float
    low: float
    high: float
    log: bool = False  # drawn log-uniformly (multiplicative factors)


# Every constant of the model, with the range `--variant` draws it from. README.md explains
# each and what it rests on. Units: s seconds, B bytes, "per h" = per unit of model width.
FACTORS: dict[str, Factor] = {
    # --- matmuls -----------------------------------------------------------------------
    "mm_eff_scale": Factor(1.0, 0.9, 1.08),  # x Device.mm_eff: achievable GEMM rate
    "width_scale": Factor(1.0, 0.7, 1.4, True),  # x Device.width_half: narrow-model penalty
    "knee_scale": Factor(1.0, 0.5, 2.0, True),  # x Device.knee_tokens: the saturation knee
    "sat_exp": Factor(1.5, 1.0, 2.0),  # sharpness of the batch saturation curve
    "fp32_eff_scale": Factor(1.0, 0.85, 1.1),  # x Device.fp32_eff: fp32 GEMMs without tensor cores
    "autotune_mm_gain": Factor(0.04, 0.0, 0.08),  # max-autotune's GEMM templates, compiled regions
    # --- attention -----------------------------------------------------------------------
    "flash_eff_scale": Factor(1.0, 0.8, 1.2),  # x Device.flash_eff
    "cudnn_vs_flash_hopper": Factor(1.5, 0.95, 1.75),  # cuDNN SDPA kernel speed / FA2 on Hopper
    "cudnn_vs_flash_other": Factor(0.85, 0.7, 1.05),  # the same on Ampere and Ada
    "efficient_vs_flash": Factor(0.6, 0.45, 0.8),  # mem-efficient (xformers cutlass) / FA2
    "efficient_fp32_eff": Factor(0.45, 0.3, 0.6),  # mem-efficient in fp32, of the fp32 peak
    "math_bmm_eff": Factor(0.75, 0.6, 0.85),  # math's batched QK^T / AV GEMMs, of the GEMM rate
    "math_score_bytes_amp": Factor(70.0, 50.0, 90.0),  # B moved per score element, fwd+bwd, eager
    "math_score_bytes_fp32": Factor(100.0, 80.0, 130.0),
    "math_compiled_share": Factor(0.35, 0.25, 0.5),  # of that traffic left once compiled
    "padded_row_fraction": Factor(0.6, 0.5, 0.7),  # token-weighted mean padded row / context
    # --- elementwise, norms, residuals -----------------------------------------------------
    "ew_bytes_eager": Factor(300.0, 220.0, 380.0),  # B per position per block per h, AMP, eager
    "ew_fp32_scale": Factor(1.3, 1.15, 1.5),  # fp32/tf32 activations: more bytes
    "ew_compiled_share": Factor(0.35, 0.28, 0.5),  # traffic left once Inductor fuses a region
    "autotune_ew_share": Factor(0.92, 0.85, 1.0),  # max-autotune: epilogues fused into GEMMs
    "model_scope_ew_share": Factor(0.93, 0.85, 1.0),  # model scope: fusion across block edges
    "bw_eff_eager": Factor(0.70, 0.6, 0.8),  # achieved fraction of HBM bandwidth, eager kernels
    "bw_eff_compiled": Factor(0.80, 0.72, 0.88),  # ... Inductor's fused kernels
    # --- head and loss ------------------------------------------------------------------------
    "head_cost_scale": Factor(1.0, 0.8, 1.3),  # the head's share: x its matmul and loss time
    "loss_bytes_eager": Factor(30.0, 24.0, 36.0),  # B per logit element, standard loss, eager AMP
    "loss_bytes_fp32": Factor(24.0, 20.0, 30.0),  # ... fp32/tf32 (no casts, 4-byte logits)
    "loss_bytes_compiled": Factor(10.0, 8.0, 14.0),  # ... head in the compiled scope
    "chunked_bytes_eager": Factor(26.0, 22.0, 32.0),  # chunked: gradients in the forward
    "chunked_bytes_compiled": Factor(11.0, 9.0, 16.0),
    "chunk_wgrad_bytes": Factor(8.0, 6.0, 12.0),  # B per head-weight element per slice (fp32 accumulate)
    "chunked_head_slowdown": Factor(0.03, 0.0, 0.06),  # chunked: the head's GEMMs in slices
    # --- checkpointing, shapes, precision -------------------------------------------------------
    "ckpt_recompute": Factor(1 / 3, 0.28, 0.42),  # extra block time per checkpointed block
    "dynamic_shape_penalty": Factor(0.04, 0.01, 0.08),  # compiled with dynamic shapes (padded)
    "fp16_scaler_cost": Factor(0.02, 0.005, 0.035),  # GradScaler: share of GPU time
    "pad_fraction": Factor(0.08, 0.06, 0.11),  # padded batching's pads at a 65536 budget
    "pad_budget_exp": Factor(0.1, 0.0, 0.2),  # pads grow with the budget (wider length groups)
    # --- launches and host -----------------------------------------------------------------------
    "gap_s": Factor(2.5e-6, 1.5e-6, 4e-6, True),  # idle GPU time between dependent kernels
    "gap_graph_s": Factor(0.7e-6, 0.4e-6, 1.2e-6, True),  # ... inside a CUDA graph
    "cpu_op_fwd_s": Factor(15e-6, 10e-6, 25e-6, True),  # eager op dispatch, forward (Python)
    "cpu_op_bwd_s": Factor(6e-6, 4e-6, 10e-6, True),  # ... backward (C++ autograd engine)
    "compiled_call_s": Factor(60e-6, 30e-6, 120e-6, True),  # a compiled region's call: guards, wrapper
    "compiled_launch_s": Factor(5e-6, 3e-6, 8e-6, True),  # one Inductor kernel launch
    "graph_replay_s": Factor(25e-6, 10e-6, 50e-6, True),  # one CUDA graph replay + its wrapper
    "ckpt_hook_s": Factor(30e-6, 15e-6, 60e-6, True),  # torch.utils.checkpoint's per-block Python
    "overlap_k": Factor(3.0, 2.0, 4.0),  # CPU/GPU overlap: exponent of the smooth maximum
    # --- data loading ----------------------------------------------------------------------------
    "data_token_s_packed": Factor(60e-9, 30e-9, 150e-9, True),  # main-process work per position
    "data_token_s_padded": Factor(50e-9, 25e-9, 120e-9, True),
    "data_row_s": Factor(25e-6, 12e-6, 50e-6, True),  # per row (Dataset.__getitem__, collate)
    "data_batch_s": Factor(0.4e-3, 0.2e-3, 0.8e-3, True),  # per batch (sampler, collate, tensors)
    "data_serial": Factor(0.3, 0.1, 0.8),  # share of the main-process data time not hidden
    "worker_handoff_s": Factor(0.15e-3, 0.08e-3, 0.3e-3, True),  # queue get + shared-memory rebuild
    "worker_ipc_scale": Factor(1.2, 1.1, 1.5),  # a worker's batch costs this much more (pickling)
    "pageable_bw": Factor(8e9, 5e9, 12e9, True),  # B/s, unpinned host-to-device staging copy (CPU)
    # --- memory ----------------------------------------------------------------------------------
    "act_bytes_per_h": Factor(34.0, 32.0, 36.0),  # Korthikanti et al.: 34 s*b*h per block, 16-bit
    "amp_act_mix": Factor(1.06, 1.0, 1.2),  # autocast keeps the residual stream and LN inputs fp32
    "fp32_act_mix": Factor(2.0, 1.9, 2.1),  # fp32/tf32: every activation 4 bytes
    "compiled_act_share": Factor(0.8, 0.7, 0.95),  # Inductor's partitioner recomputes cheap ops
    "math_saved_bytes_amp": Factor(6.0, 5.0, 8.0),  # math: B saved per score element (fp32 softmax + cast)
    "math_saved_bytes_fp32": Factor(8.0, 7.0, 10.0),
    "logits_bytes_eager": Factor(10.0, 8.0, 12.0),  # standard loss: 4 B fp32 x 2.5 per logit at its peak
    "logits_bytes_fp32": Factor(12.0, 10.0, 14.0),
    "logits_bytes_compiled": Factor(6.0, 5.0, 8.0),  # head compiled: the upcast fused
    "graph_pool_share": Factor(0.5, 0.3, 1.0),  # reduce-overhead: pool copy of the activations
    "frag_padded": Factor(0.05, 0.02, 0.08),  # fragmentation as batch widths vary
    "frag_packed": Factor(0.01, 0.0, 0.02),
    "reserved_overhead": Factor(0.03, 0.01, 0.06),  # the caching allocator's reserve over its peak
    "compile_ws_bytes": Factor(256 * MIB, 128 * MIB, 512 * MIB, True),  # Inductor/Triton workspace
    "autotune_ws_bytes": Factor(1.5 * GIB, 0.5 * GIB, 3 * GIB, True),  # max-autotune benchmarking buffers
    "misc_bytes": Factor(256 * MIB, 128 * MIB, 512 * MIB, True),  # cuBLAS/cuDNN workspaces, RNG, etc.
    "usable_memory": Factor(0.985, 0.975, 0.995),  # of the total, what the process can allocate
    "alloc_pressure_start": Factor(0.92, 0.88, 0.96),  # of usable: the allocator starts freeing its cache
    "alloc_pressure_cost": Factor(0.04, 0.0, 0.08),  # slowdown at the limit (cudaFree/cudaMalloc retries)
    # --- measurement ------------------------------------------------------------------------------
    "noise": Factor(0.012, 0.008, 0.02),  # multiplicative measurement noise (lognormal sigma)
    "cv_base": Factor(0.006, 0.003, 0.012),  # step-time CV of a steady GPU step
    "cv_jitter_s": Factor(0.2e-3, 0.1e-3, 0.4e-3, True),  # absolute per-step host jitter
    "cv_padded": Factor(0.06, 0.03, 0.10),  # padded: steps of varying width
    # --- trial costs -------------------------------------------------------------------------------
    "process_base_s": Factor(14.0, 10.0, 18.0),  # spawn, imports, CUDA init, teardown
    "build_s_per_gparam": Factor(2.5, 1.5, 4.0),  # model build + to(device), per 1e9 parameters
    "data_setup_s": Factor(1.5, 0.8, 3.0),
    "workers_start_s": Factor(1.2, 0.6, 2.5),  # 4 DataLoader worker processes
    "first_step_s": Factor(1.5, 0.8, 3.0),  # cuBLAS/cuDNN handles, allocator warm-up
    "compile_block_s": Factor(50.0, 35.0, 70.0),  # default mode, one block graph, fwd + bwd
    "compile_head_s": Factor(20.0, 12.0, 35.0),  # + the head and loss (blocks+head)
    "compile_model_base_s": Factor(30.0, 20.0, 45.0),  # model scope: one graph ...
    "compile_model_per_layer_s": Factor(3.5, 2.0, 5.0),  # ... growing with the depth
    "autotune_extra_s": Factor(150.0, 100.0, 260.0),  # max-autotune: benchmarking GEMM choices
    "graph_capture_s": Factor(8.0, 4.0, 15.0),  # reduce-overhead: warm-up runs + recording
    "dynamic_recompile": Factor(1.6, 1.3, 2.2),  # padded: recompiles with dynamic shapes
    "partial_ckpt_compile": Factor(1.7, 1.4, 2.0),  # two block variants to compile
    "chunk_compile_s": Factor(0.8, 0.4, 1.5),  # per unrolled loss slice, head compiled
}


assert all(f.low <= f.default <= f.high for f in FACTORS.values()), "a default outside its range"


def draw_factors(variant: int | None) -> dict[str, float]:
    """The defaults, or for variant N every factor drawn from its range (seeded by N)."""
    if not variant:
        return {k: f.default for k, f in FACTORS.items()}
    rng = random.Random(f"autotune-landscape-variant:{variant}")
    out = {}
    for k, f in FACTORS.items():  # insertion order: a new factor appended keeps the others' draws
        u = rng.random()
        if f.log:
            out[k] = math.exp(math.log(f.low) + u * (math.log(f.high) - math.log(f.low)))
        else:
            out[k] = f.low + u * (f.high - f.low)
    return out


def hash_int(text: str) -> int:
    """A stable integer for a string (Python's hash() is salted per process)."""
    h = 0
    for ch in text.encode():
        h = (h * 1_000_003 + ch) % (1 << 61)
    return h


# --------------------------------------------------------------------------- the model

LOSS_CHUNK_ELEMENTS = 1 << 26  # autotune/model/loss.py: CHUNK_LOGITS
LOSS_MAX_CHUNKS = 32  # ... MAX_CHUNKS
# Padded rows are documents (autotune.data.datasets.SyntheticDataset: log-normal lengths, median
# seq_len / 4, sigma 1, pieces of at most seq_len + 1): about 400 tokens a row on average.
PADDED_MEAN_ROW_TOKENS = 400


def loss_chunks(tokens: int, vocab: int) -> int:
    """The chunked loss's slice count (autotune.model.loss.chunk_count)."""
    return min(LOSS_MAX_CHUNKS, max(1, math.ceil(tokens * vocab / LOSS_CHUNK_ELEMENTS)))


@dataclass
class Estimate:
    """What the model says of one configuration (before noise)."""

    step_s: float
    gpu_s: float
    cpu_s: float
    data_main_s: float
    tokens_per_step: float
    pad_fraction: float
    peak_bytes: float
    parts: dict[str, float]


class Model:
    """The analytic model for one (device, model shape, factors)."""

    def __init__(self, dev: Device, shape: Shape, f: Mapping[str, float]) -> None:
        self.dev, self.shape, self.f = dev, shape, f
        self.usable = dev.total_memory_bytes * f["usable_memory"]  # above it: out of memory

    # -- helpers --
    def sat(self, m: float, n: float) -> float:
        """Share of the GPU a GEMM of m x n outputs fills: 1 / (1 + (knee / (m n))^p), the knee
        being the device's knee_tokens at width 768 times the blocks' mean output width."""
        knee = self.dev.knee_tokens * self.f["knee_scale"] * 2.5 * 768
        return 1.0 / (1.0 + (knee / (m * n)) ** self.f["sat_exp"])

    def width(self) -> float:
        h = self.shape.n_embd
        return h / (h + self.dev.width_half * self.f["width_scale"])

    def mm_rate(self, dtype: str, m: float, n: float, head: bool = False) -> float:
        """Achieved GEMM FLOP/s in this dtype for m x n outputs. The narrow-model penalty is the
        blocks' (K = the width in most of their GEMMs); of the head's three GEMMs only the
        forward has K = the width (the backward's have K = the vocabulary or the batch)."""
        if dtype == "float32":  # CUDA-core GEMMs: compute-bound at these shapes, no tile penalty
            return self.dev.peak[dtype] * self.dev.fp32_eff * self.f["fp32_eff_scale"] * self.sat(m, n)
        eff = self.dev.mm_eff * self.f["mm_eff_scale"]
        width = (self.width() + 2) / 3 if head else self.width()
        return self.dev.peak[dtype] * eff * width * self.sat(m, n)

    # -- the step --
    def estimate(self, cfg: TrainConfig) -> Estimate:
        f, dev, s = self.f, self.dev, self.shape
        L, h, a, V, T = s.n_layer, s.n_embd, s.n_head, s.vocab, s.seq_len
        M = cfg.token_budget
        amp = cfg.amp_dtype in ("float16", "bfloat16")
        compiled = cfg.compile_mode != "none"
        head_compiled = compiled and cfg.compile_scope in ("blocks+head", "model")
        model_scope = compiled and cfg.compile_scope == "model"
        autotune = cfg.compile_mode == "max-autotune-no-cudagraphs"
        graphs = cfg.compile_mode == "reduce-overhead"
        padded = cfg.batching == "padded"
        ckpt = set(cfg.checkpoint_layers)
        n_ckpt = len(ckpt)
        chunked = cfg.loss_impl == "chunked"
        chunks = loss_chunks(M, V) if chunked else 1
        pad = f["pad_fraction"] * (M / 65536) ** f["pad_budget_exp"] if padded else 0.0
        t_row = T * f["padded_row_fraction"] if padded else T  # mean row length (attention time)

        # GEMMs: the block matmuls, 72 h^2 FLOPs per position per block (fwd + bwd), and the
        # head's 6 V h; max-autotune's templates in what it compiled.
        gain_blocks = 1 + f["autotune_mm_gain"] if autotune else 1.0
        gain_head = gain_blocks if head_compiled else 1.0
        t_mm_blocks = L * M * 72 * h * h / (self.mm_rate(cfg.amp_dtype, M, 2.5 * h) * gain_blocks)
        slice_m = M / chunks
        t_mm_head = M * 6 * V * h / (self.mm_rate(cfg.amp_dtype, slice_m, V, head=True) * gain_head)
        if chunked:  # three GEMMs per slice, the head weight read again for each
            t_mm_head *= 1 + f["chunked_head_slowdown"]

        # Attention, per block.
        bw_eager = dev.hbm_bw * f["bw_eff_eager"]
        bw_compiled = dev.hbm_bw * f["bw_eff_compiled"]
        bw_blocks = bw_compiled if compiled else bw_eager
        backend = cfg.sdpa_backend
        if backend == "math":  # the full T x T scores, masked: twice the causal FLOPs, and traffic
            flops = 12 * t_row * h * M
            t_attn = flops / (self.mm_rate(cfg.amp_dtype, M, 2.5 * h) * f["math_bmm_eff"])
            per_score = f["math_score_bytes_amp"] if amp else f["math_score_bytes_fp32"]
            if compiled:
                per_score *= f["math_compiled_share"]
            t_attn += M * a * t_row * per_score / bw_blocks
        else:  # fused kernels skip the masked half: 6 T h per position, fwd + bwd
            flops = 6 * t_row * h * M
            if amp:
                rate = dev.peak["bfloat16"] * dev.flash_eff * f["flash_eff_scale"] * self.sat(M, 2.5 * h)
                if backend == "cudnn":
                    rate *= f["cudnn_vs_flash_hopper"] if dev.arch == "hopper" else f["cudnn_vs_flash_other"]
                elif backend == "efficient":
                    rate *= f["efficient_vs_flash"]
            else:  # mem-efficient attention on fp32 inputs: no tensor cores
                rate = dev.peak["float32"] * f["efficient_fp32_eff"] * self.sat(M, 2.5 * h)
            t_attn = flops / rate

        # Elementwise traffic of a block (norms, GeLU, residuals, casts, transposes).
        ew = M * h * f["ew_bytes_eager"] * (1.0 if amp else f["ew_fp32_scale"])
        if compiled:
            ew *= f["ew_compiled_share"]
            if autotune:
                ew *= f["autotune_ew_share"]
            if model_scope:
                ew *= f["model_scope_ew_share"]
        t_ew = ew / bw_blocks

        t_block = t_mm_blocks / L + t_attn + t_ew  # one block, no recompute
        t_blocks = t_block * (L + f["ckpt_recompute"] * n_ckpt)

        # The head's loss: logits traffic, fused only when the head is compiled.
        bw_head = bw_compiled if head_compiled else bw_eager
        if chunked:
            per_logit = f["chunked_bytes_compiled"] if head_compiled else f["chunked_bytes_eager"]
        elif head_compiled:
            per_logit = f["loss_bytes_compiled"]
        else:
            per_logit = f["loss_bytes_eager"] if amp else f["loss_bytes_fp32"]
        t_loss = M * V * per_logit / bw_head
        if chunked:  # each slice accumulates the head weight's fp32 gradient
            t_loss += chunks * V * h * f["chunk_wgrad_bytes"] / bw_head
        t_head = (t_mm_head + t_loss) * f["head_cost_scale"]

        compute = t_blocks + t_head
        if padded and compiled:
            compute *= 1 + f["dynamic_shape_penalty"]
        # Fused AdamW (28 B per parameter), autocast's weight casts (6 B per block parameter,
        # again for each recomputed block), GradScaler.
        params = s.params
        t_opt = params * 28 / (dev.hbm_bw * 0.85)
        if amp:
            t_opt += (s.block_params * (1 + n_ckpt / L) + V * h) * 6 / bw_eager
        if cfg.amp_dtype == "float16":
            compute *= 1 + f["fp16_scaler_cost"]
            t_opt += params * 4 / bw_eager

        # Kernels per step: launches (CPU) and gaps (GPU).
        # Eager: ~62 per block (forward 22 with autocast's casts and the transposes, backward
        # 40); compiled: ~27 (25 in one graph); the head eager ~14, compiled ~6, plus a few
        # per loss slice; a recomputed block repeats its forward's; fused AdamW ~8.
        k_block = (25 if model_scope else 27) if compiled else 62
        if head_compiled:
            k_head = 6 + (4 * chunks if chunked else 0)
        else:
            k_head = 14 + (8 * chunks if chunked else 0)
        kernels = L * k_block + k_head + 8 + n_ckpt * (9 if compiled else 22)
        gap = f["gap_graph_s"] if graphs else f["gap_s"]
        gpu = compute + t_opt + kernels * gap

        # Host: dispatch per step.
        if not compiled:
            cpu = L * (22 * f["cpu_op_fwd_s"] + 40 * f["cpu_op_bwd_s"])
            cpu += n_ckpt * (22 * f["cpu_op_fwd_s"] + f["ckpt_hook_s"])
        else:
            regions = 1 if model_scope else L + (1 if head_compiled else 0)
            if graphs:
                cpu = regions * 2 * f["graph_replay_s"]
            else:
                cpu = regions * 2 * f["compiled_call_s"] + L * k_block * f["compiled_launch_s"]
            cpu += n_ckpt * f["ckpt_hook_s"] * (0.3 if model_scope else 1.0)
        if not head_compiled:  # the head's ops, eager (and ten more per loss slice)
            cpu += 8 * f["cpu_op_fwd_s"] + 6 * f["cpu_op_bwd_s"] + (chunks * 10 * f["cpu_op_fwd_s"] if chunked else 0)
        elif not graphs:  # its compiled kernels' launches (a graph replays them for free)
            cpu += k_head * f["compiled_launch_s"]
        cpu += 0.3e-3  # fused AdamW + zero_grad + the loop's own bookkeeping
        if cfg.amp_dtype == "float16":
            cpu += 0.2e-3
        cpu *= dev.cpu_speed

        # Data: with 0 workers the main process builds every batch; with workers it takes a
        # ready one from the queue (and, unpinned, stages the host-to-device copy itself).
        rows = M / T if not padded else M / PADDED_MEAN_ROW_TOKENS
        build = (
            rows * f["data_row_s"]
            + M * (f["data_token_s_padded"] if padded else f["data_token_s_packed"])
            + f["data_batch_s"]
        ) * dev.cpu_speed
        copy = M * 16 / f["pageable_bw"]  # input ids + labels, int64
        if cfg.num_workers == 0:
            data_main = build + copy
        else:
            data_main = f["worker_handoff_s"] + (0.0 if cfg.pin_memory else copy)
        cpu_total = cpu + data_main
        k = f["overlap_k"]
        step = (gpu**k + cpu_total**k) ** (1 / k)
        if cfg.num_workers == 0:
            step += f["data_serial"] * build
        else:  # workers that cannot keep up
            worker_time = build * f["worker_ipc_scale"] / cfg.num_workers
            step = max(step, worker_time)

        peak = self.peak_memory(cfg, amp, compiled, head_compiled, graphs, autotune, padded, ckpt, chunks)
        # Close to the device's memory the caching allocator frees its cache and retries
        # (torch.cuda.memory_stats' num_alloc_retries): synchronizing cudaFree/cudaMalloc calls.
        start = f["alloc_pressure_start"]
        step *= 1 + f["alloc_pressure_cost"] * min(1.0, max(0.0, (peak / self.usable - start) / (1 - start)))
        parts = {
            "mm_blocks": t_mm_blocks,
            "attention": t_attn * L,
            "elementwise": t_ew * L,
            "recompute": t_block * f["ckpt_recompute"] * n_ckpt,
            "head": t_head,
            "optimizer": t_opt,
            "gaps": kernels * gap,
            "cpu": cpu,
            "data_main": data_main,
        }
        return Estimate(step, gpu, cpu_total, data_main, M * (1 - pad), pad, peak, parts)

    def peak_memory(
        self,
        cfg: TrainConfig,
        amp: bool,
        compiled: bool,
        head_compiled: bool,
        graphs: bool,
        autotune: bool,
        padded: bool,
        ckpt: set[int],
        chunks: int,
    ) -> float:
        """Peak bytes as NVML reports them: static (context, workspaces, weights + grads + Adam,
        autocast's weight copies) plus the dynamic peak of the step, which is the larger of the
        end of the forward (every block's saved activations and the loss's logits) and the
        recompute of a checkpointed block during the backward (the blocks before it still
        holding theirs). Positions at the worst-case batch shape: full-width rows."""
        f, s = self.f, self.shape
        L, h, a, V, T = s.n_layer, s.n_embd, s.n_head, s.vocab, s.seq_len
        M = cfg.token_budget
        static = self.dev.context_bytes + f["misc_bytes"] + 16 * s.params
        if amp:
            static += 2 * (s.block_params + V * h)  # bf16/fp16 weight copies saved for backward
        if compiled:
            static += f["compile_ws_bytes"]
        if autotune:
            static += f["autotune_ws_bytes"]

        mix = f["amp_act_mix"] if amp else f["fp32_act_mix"]
        full = h * f["act_bytes_per_h"] * mix  # per position, one block (Korthikanti's 34 s b h)
        if compiled:
            full *= f["compiled_act_share"]
        if cfg.sdpa_backend == "math":  # the T x T scores and probabilities, per head
            full += a * T * (f["math_saved_bytes_amp"] if amp else f["math_saved_bytes_fp32"])
        kept = 4 * h  # a checkpointed block keeps its (fp32) input
        saved = [kept if i in ckpt else full for i in range(L)]
        other = 10 * h  # embeddings, final norm, the head's input

        if cfg.loss_impl == "chunked":
            per = f["logits_bytes_compiled"] if head_compiled else f["logits_bytes_eager"]
            logits = math.ceil(M / chunks) * V * per + M * h * 4
        elif head_compiled:
            logits = M * V * f["logits_bytes_compiled"]
        else:
            logits = M * V * (f["logits_bytes_eager"] if amp else f["logits_bytes_fp32"])

        total_saved = sum(saved)
        forward_end = M * (total_saved + other) + logits
        recompute = 0.0
        before = 0.0
        for i in range(L):  # the backward reaches block i with blocks 0..i-1 still saved
            if i in ckpt:
                recompute = max(recompute, M * (before + other + kept + full))
            before += saved[i]
        dynamic = max(forward_end, recompute)
        if graphs:  # the CUDA graph pool's copy of the activations, and static inputs
            dynamic += f["graph_pool_share"] * M * total_saved + M * 16
        dynamic *= 1 + (f["frag_padded"] if padded else f["frag_packed"])
        dynamic *= 1 + f["reserved_overhead"]
        return static + dynamic

    # -- trial costs --
    def costs(self, cfg: TrainConfig, step: float, oom: bool, cv: float, rng: random.Random) -> dict[str, float]:
        """process + compile + timed seconds of the trial: process is the start-up (spawn,
        imports, CUDA, model, data, workers, teardown), compile the compiler's extra warm-up
        time, timed the timed window plus the warm-up steps (record_sweep.py counts the warm-up
        steps in process instead; the sum, the trial's wall time, is the same)."""
        f, s = self.f, self.shape
        L = s.n_layer
        padded = cfg.batching == "padded"
        process = (
            f["process_base_s"]
            + f["build_s_per_gparam"] * s.params / 1e9
            + f["data_setup_s"]
            + (f["workers_start_s"] if cfg.num_workers else 0.0)
            + f["first_step_s"]
        )
        compile_s = 0.0
        if cfg.compile_mode != "none":
            n_ckpt = len(cfg.checkpoint_layers)
            partial = 0 < n_ckpt < L
            width = (s.n_embd / 768) ** 0.3
            if cfg.compile_scope == "model":
                compile_s = f["compile_model_base_s"] + f["compile_model_per_layer_s"] * L * (1.1 if partial else 1.0)
            else:
                compile_s = f["compile_block_s"] * width * (f["partial_ckpt_compile"] if partial else 1.0)
                if n_ckpt == L:
                    compile_s *= 1.15
            if cfg.compile_scope in ("blocks+head", "model"):
                compile_s += f["compile_head_s"] if cfg.compile_scope == "blocks+head" else 0.5 * f["compile_head_s"]
                if cfg.loss_impl == "chunked":
                    compile_s += f["chunk_compile_s"] * loss_chunks(cfg.token_budget, s.vocab)
            if cfg.compile_mode == "max-autotune-no-cudagraphs":
                compile_s += f["autotune_extra_s"] * (1.0 if cfg.compile_scope == "blocks" else 1.3)
            if cfg.compile_mode == "reduce-overhead":
                compile_s += f["graph_capture_s"] + 0.3 * L
            if padded:
                compile_s *= f["dynamic_recompile"]
            compile_s *= self.dev.cpu_speed**0.5 * math.exp(rng.gauss(0.0, 0.08))
        process *= math.exp(rng.gauss(0.0, 0.06))
        if oom:  # it failed in the first warm-up step: the forward compiled, the backward not
            return {"process_s": process, "compile_s": 0.6 * compile_s, "timed_s": 0.0}
        timed = max(RUN["steps"] * step, RUN["min_time_s"])
        if cv > CV_TARGET:  # a noisy window is timed again
            timed *= 2
        # + the warm-up steps (and one step on each extreme shape of padded batches): counted
        # here, not in process_s, so that process_s is the configuration-independent start-up
        timed += (RUN["warmup"] + (2 if padded else 0)) * step
        return {"process_s": process, "compile_s": compile_s, "timed_s": timed}


# --------------------------------------------------------------------------- landscapes


def landscape_name(device: str, model: str, variant: int | None = None) -> str:
    return f"{device}-{model}" + (f"-v{variant}" if variant else "")


def rule_reason(space, cfg: TrainConfig) -> str | None:
    """Why the tuner would prune `cfg` before a process starts (record_sweep.rejection): a rule
    of the space, or one of the device rules (all four devices are Ampere or newer, with
    triton: none of them rejects anything the space allows)."""
    return space.violation(cfg)


def build(device: str, model: str, variant: int | None = None) -> dict[str, Any]:
    """One landscape as the sweep dict (version 2 of record_sweep.py's format)."""
    dev, shape = DEVICES[device], SHAPES[model]
    factors = draw_factors(variant)
    space = load_space(SPACE_FILE, n_layer=shape.n_layer, seq_len=shape.seq_len)
    mdl = Model(dev, shape, factors)
    name = landscape_name(device, model, variant)
    records = []
    for params, cfg in enumerate_space(space):
        d = cfg.to_dict()
        key = json.dumps(d, sort_keys=True)  # _common.config_key of a TrainConfig
        rec: dict[str, Any] = {"params": params, "config": d, "key": key}
        reason = rule_reason(space, cfg)
        if reason is not None:
            rec |= {"outcome": "unsupported", "reason": reason, "tokens_per_sec": None, "peak_memory_bytes": None}
            rec |= {"step_time_cv": None, "data_wait_fraction": None, "padding_fraction": None}
            rec |= {"process_s": 0.0, "compile_s": 0.0, "timed_s": 0.0, "wall_s": 0.0}
            records.append(rec)
            continue
        rng = random.Random(f"{name}:{key}")
        est = mdl.estimate(cfg)
        oom = est.peak_bytes > mdl.usable
        cv = step_cv(cfg, est, est.step_s, factors, rng)
        # The measured mean step is off by the run-to-run noise and by the spread of the steps
        # over the window (the loop times >= 20 steps and >= 2 s; a noisy window twice that).
        steps = max(RUN["steps"], RUN["min_time_s"] / est.step_s) * (2 if cv > CV_TARGET else 1)
        sigma = math.sqrt(factors["noise"] ** 2 + cv * cv / steps)
        step = est.step_s * math.exp(rng.gauss(0.0, sigma))
        costs = mdl.costs(cfg, step, oom, cv, rng)
        if oom:
            reason = f"CUDA out of memory: the step needs more than the {dev.total_memory_bytes / GIB:.1f} GiB device"
            reason += " (modelled)"
            rec |= {"outcome": "oom", "reason": reason, "tokens_per_sec": None, "peak_memory_bytes": None}
            rec |= {"step_time_cv": None, "data_wait_fraction": None, "padding_fraction": None}
        else:
            peak = est.peak_bytes * (1 + rng.gauss(0.0, 0.002))
            rec |= {
                "outcome": "ok",
                "reason": None,
                "tokens_per_sec": round(est.tokens_per_step / step, 1),
                "peak_memory_bytes": int(round(peak / (2 * MIB))) * 2 * MIB,
                "step_time_cv": round(cv, 4),
                "data_wait_fraction": round(min(1.0, est.data_main_s / step), 4),
                "padding_fraction": round(est.pad_fraction * math.exp(rng.gauss(0.0, 0.03)), 4),
            }
        rec |= {k: round(v, 2) for k, v in costs.items()}
        rec["wall_s"] = round(rec["process_s"] + rec["compile_s"] + rec["timed_s"], 2)
        records.append(rec)
    return {
        "format": "autotune.sweep",
        "version": 2,
        "created": MODEL_DATE,
        "model": model,
        "device": dev.info(),
        "machine": {
            "host": "analytic model (benchmarks/landscapes/generate.py)",
            "cpu": dev.cpu,
            "cores": dev.cpu_count,
            "torch": "2.13.0+cu128 (modelled)",
            "python": "3.11 (modelled)",
        },
        "run": dict(RUN),
        "compile_cache": "modelled: a cold inductor cache per configuration",
        "space": space.to_dict(),
        "space_source": SPACE_SOURCE,
        "space_hash": space.hash,
        "n_layer": shape.n_layer,
        "seq_len": shape.seq_len,
        "complete": True,
        "synthetic": True,
        "generator": {
            "script": "benchmarks/landscapes/generate.py",
            "model_version": MODEL_VERSION,
            "landscape": name,
            "variant": variant,
            "factors": factors,
            "device_model": {
                k: v
                for k, v in vars(dev).items()
                if k
                in (
                    "mm_eff",
                    "width_half",
                    "knee_tokens",
                    "flash_eff",
                    "fp32_eff",
                    "hbm_bw",
                    "cpu_speed",
                    "context_bytes",
                    "arch",
                )
            }
            | {"peak_flops": dict(dev.peak)},
            "note": "no GPU ran these: every figure is the analytic model of benchmarks/landscapes/README.md, "
            "with seeded noise",
        },
        "configurations": records,
    }


def step_cv(cfg: TrainConfig, est: Estimate, step: float, f: Mapping[str, float], rng: random.Random) -> float:
    """A plausible step-time CV: a steady GPU step is within a percent; host jitter weighs on
    short steps; padded batches vary in width (and so in time); the main process's data loading
    adds its own jitter; CUDA graphs steady the host side."""
    parts = [f["cv_base"], f["cv_jitter_s"] / step * (0.5 if cfg.compile_mode == "reduce-overhead" else 1.0)]
    if cfg.batching == "padded":
        parts.append(f["cv_padded"])
    if cfg.num_workers == 0:
        parts.append(0.3 * est.data_main_s / step)
    return math.sqrt(sum(p * p for p in parts)) * math.exp(rng.gauss(0.0, 0.2))


def write_landscape(data: Mapping[str, Any], path: Path) -> int:
    """Gzipped JSON, byte-for-byte reproducible (no mtime or name in the gzip header)."""
    raw = json.dumps(data, separators=(",", ":")).encode()
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh, gzip.GzipFile(filename="", mode="wb", fileobj=fh, mtime=0, compresslevel=9) as gz:
        gz.write(raw)
    tmp.replace(path)
    return path.stat().st_size


def load_landscape(path: str | Path) -> dict[str, Any]:
    """A landscape (or any sweep) from `.json` or `.json.gz`, as the dict
    `_replay.Sweep.from_dict` takes."""
    path = Path(path)
    if path.name.endswith(".gz"):
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            return json.load(fh)
    return json.loads(path.read_text(encoding="utf-8"))


# --------------------------------------------------------------------------- the summary


def _measured(rec: Mapping[str, Any]) -> bool:
    return rec["outcome"] in ("ok", "over_memory_limit") and rec.get("tokens_per_sec") is not None


def memory_limit(records: Sequence[Mapping[str, Any]], quantile: float) -> int:
    """As `_replay.memory_limit`: the quantile of the measured peaks, rounded down to a MiB."""
    peaks = sorted(r["peak_memory_bytes"] for r in records if _measured(r))
    peak = peaks[min(len(peaks) - 1, int(quantile * len(peaks)))]
    return peak // MIB * MIB


def short(cfg: Mapping[str, Any], params: Mapping[str, Any]) -> str:
    """A configuration in a few words."""
    dtype = {"float32": "fp32", "tf32": "tf32", "float16": "fp16", "bfloat16": "bf16"}[cfg["amp_dtype"]]
    modes = {
        "none": "eager",
        "default": "default",
        "max-autotune-no-cudagraphs": "autotune",
        "reduce-overhead": "graphs",
    }
    mode = modes[cfg["compile_mode"]]
    comp = mode if mode == "eager" else f"{mode}/{cfg['compile_scope']}"
    workers = f"w{cfg['num_workers']}" + ("p" if cfg["pin_memory"] else "")
    return (
        f"{cfg['token_budget']} {cfg['batching']} {dtype} {cfg['sdpa_backend']} {comp} {cfg['loss_impl']} "
        f"ckpt{params.get('checkpoint_count', 0)} {workers}"
    )


def summarize(data: Mapping[str, Any]) -> dict[str, Any]:
    recs = data["configurations"]
    counts = {o: sum(r["outcome"] == o for r in recs) for o in ("ok", "oom", "unsupported")}
    ok = [r for r in recs if _measured(r)]
    out: dict[str, Any] = {"name": data["generator"]["landscape"], "n": len(recs), **counts}
    best = max(ok, key=lambda r: r["tokens_per_sec"])
    out["best"] = _best_entry(best, ok, None)
    out["limits"] = {}
    for q in QUANTILES:
        limit = memory_limit(recs, q)
        feasible = [r for r in ok if r["peak_memory_bytes"] <= limit]
        b = max(feasible, key=lambda r: r["tokens_per_sec"])
        out["limits"][q] = _best_entry(b, feasible, limit) | {"over": len(recs) - counts["unsupported"] - len(feasible)}
    out["trial_s_all"] = round(sum(r["wall_s"] for r in recs))
    return out


def _best_entry(best: Mapping[str, Any], pool: Sequence[Mapping[str, Any]], limit: int | None) -> dict[str, Any]:
    target = best["tokens_per_sec"] * (1 - TOLERANCE)
    return {
        "limit": limit,
        "tokens_per_sec": best["tokens_per_sec"],
        "peak": best["peak_memory_bytes"],
        "within": sum(r["tokens_per_sec"] >= target for r in pool),
        "config": short(best["config"], best["params"]),
        "wall_s": best["wall_s"],
    }


def print_summary(summaries: Iterable[Mapping[str, Any]]) -> None:
    rows = []
    for s in summaries:
        b = s["best"]
        rows.append(
            [
                s["name"],
                s["n"],
                s["ok"],
                s["oom"],
                s["unsupported"],
                "none",
                f"{b['tokens_per_sec']:,.0f}",
                f"{b['peak'] / GIB:.1f}",
                b["within"],
                b["config"],
            ]
        )
        for q, e in s["limits"].items():
            rows.append(
                [
                    "",
                    "",
                    "",
                    "",
                    "",
                    f"q{q}: {e['limit'] / GIB:.1f} GiB",
                    f"{e['tokens_per_sec']:,.0f}",
                    f"{e['peak'] / GIB:.1f}",
                    e["within"],
                    e["config"],
                ]
            )
    headers = [
        "landscape",
        "configs",
        "ok",
        "oom",
        "unsupp.",
        "memory limit",
        "best tok/s",
        "peak GiB",
        "within 3 %",
        "best configuration (budget batching dtype sdpa compile loss ckpt workers)",
    ]
    print(_common.md_table(headers, rows))


def check_replay(path: Path) -> str:
    """Load a written landscape through `_replay.Sweep.from_dict` (the space and the table of
    every configuration by key) and check the table covers every configuration."""
    import _replay

    data = load_landscape(path)
    sweep = _replay.Sweep.from_dict(data, str(path))
    assert len(sweep.table) == len(data["configurations"]), "duplicate configuration keys"
    for q in QUANTILES:
        assert _replay.memory_limit(sweep.records, q) == memory_limit(data["configurations"], q)
    return (
        f"{path.name}: _replay.Sweep.from_dict loads it ({len(sweep.table)} configurations by key, "
        f"the space bound to {sweep.space.n_layer} blocks)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out-dir", default=str(HERE), help="where to write <name>.json.gz (default: beside this script)")
    p.add_argument("--variant", type=int, default=None, help="N >= 1: draw every factor from its range, seeded by N")
    p.add_argument("--only", nargs="*", default=None, help="landscape names (e.g. h200-gpt2) to generate")
    p.add_argument("--check", action="store_true", help="load each written file through _replay.Sweep.from_dict")
    p.add_argument("--no-write", action="store_true", help="build and summarize only")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = p.parse_args(argv)
    if args.variant is not None and args.variant < 1:
        p.error("--variant takes N >= 1 (no --variant: the canonical landscapes)")
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    chosen = [(d, m) for d, m in LANDSCAPES if not args.only or landscape_name(d, m) in args.only]
    if not chosen:
        p.error(f"no landscape named {args.only}; known: {', '.join(landscape_name(d, m) for d, m in LANDSCAPES)}")
    summaries, notes = [], []
    for device, model in chosen:
        started = time.perf_counter()
        data = build(device, model, args.variant)
        path = out_dir / f"{data['generator']['landscape']}.json.gz"
        size = None if args.no_write else write_landscape(data, path)
        summaries.append(summarize(data))
        notes.append(
            f"{path.name}: {len(data['configurations'])} configurations, "
            + ("not written" if size is None else f"{size / 1e6:.2f} MB")
            + f", {time.perf_counter() - started:.1f} s"
        )
        if args.check and size is not None:
            notes.append("  check: " + check_replay(path))
    if args.json:
        print(json.dumps(summaries, indent=1))
    else:
        print("\n".join(notes))
        print()
        print_summary(summaries)
    return 0


if __name__ == "__main__":
    sys.exit(main())
