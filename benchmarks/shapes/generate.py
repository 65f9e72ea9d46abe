"""The "shapes" landscapes: five synthetic sweeps, each built around one shape of landscape that
the other two generators (benchmarks/landscapes/, benchmarks/holdout/) do not make, so that a
search can be checked on it. The tuner was not tuned on any of them.

    python benchmarks/shapes/generate.py                 # write all five here, print the summary
    python benchmarks/shapes/generate.py --only edge     # one (repeatable)
    python benchmarks/shapes/generate.py --check         # summarise the files as written
    python benchmarks/shapes/generate.py --no-write      # build and summarise, write nothing

  interacting  knobs that pay only together: max-autotune gains only with compile_scope=model
               (it loses 3-6 % with per-block graphs); cuDNN attention is the fastest eager
               kernel but breaks the compiled graph (not the fastest compiled); a whole-model
               graph loses more to padded batches than a block graph
  edge         the best configuration sits just under the memory limit: throughput keeps rising
               with the token budget, and peaks are a smooth static + per-token x budget, so the
               largest budget that fits is the answer and its peak is 1-3 % under the limit
  heavy-tail   an ordinary landscape whose records are not all honest: ~5 % measured 10-25 % low
               (a throttled or shared GPU) and ~1 % crashed or timed out (no tokens/s)
  host-bound   text tokenized on the fly by a 4-vCPU host: tokens/s = a soft minimum of the
               GPU's rate and the DataLoader's supply, which peaks at a middle worker count
  pre-ampere   a V100 16 GB: float16 only (bfloat16 and tf32 unsupported), no flash or cuDNN
               attention (unsupported), efficient attention the fast kernel, less memory

A sweep is record_sweep.py's format (`autotune.sweep`, version 2), every configuration of the
landscape's space (spaces/*.yaml beside this file, enumerated by `_common.enumerate_space`) with
an outcome, effective tokens/s, peak memory, step-time CV, data-wait and padding fractions and
its cost as a trial (process + compile + timed seconds), and `synthetic: true`. The cost model
below was written for this file, apart from the other two generators (none of their code or
constants is used); see README.md beside it. Deterministic: every random draw is seeded by the
landscape and the configuration's key, and the gzip header carries no time, so the same command
writes the same bytes. Standard library, the checkout's space loader, its device support rules
(autotune.knobs.support: what a pre-Ampere GPU refuses) and benchmarks/_common.py."""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import hashlib
import json
import math
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent
if str(BENCH) not in sys.path:  # run as `python benchmarks/shapes/generate.py`
    sys.path.insert(0, str(BENCH))

import _common  # noqa: E402,F401  (puts the checkout on sys.path)
from _common import config_key, enumerate_space  # noqa: E402

from autotune.config import TrainConfig  # noqa: E402
from autotune.errors import UnsupportedConfig  # noqa: E402
from autotune.knobs.support import DeviceCapabilities, check_supported  # noqa: E402
from autotune.space.file import load_space  # noqa: E402

CREATED = "2026-12-01T00:00:00+00:00"  # the model's date, not the run's: reproducible bytes
MODEL_VERSION = 1
VOCAB = 50304
SEQ = 1024
GB = 1e9
MIB = 2**20
HALF = ("float16", "bfloat16")
RUN = {"steps": 20, "warmup": 3, "min_time_s": 2.0}  # autotune.config.RunSpec's defaults
CV_SECOND_WINDOW = 0.05  # the measuring loop times a second window above this CV
TRIAL_TIMEOUT_S = 600.0  # autotune search's CUDA trial timeout (search.run.DEFAULT_TRIAL_TIMEOUT_S)
QUANTILES = (0.3, 0.5, 0.8, 0.95)
TOLERANCE = 0.03

MODELS = {  # name: (blocks, width, heads)
    "gpt2": (12, 768, 12),
    "gpt2-medium": (24, 1024, 16),
}


@dataclass(frozen=True)
class Gpu:
    """One card and the host it sits in: the constants the model reads."""

    name: str
    cc: str
    memory: int  # total bytes, as NVML reports them
    tensor: float  # dense float16/bfloat16 tensor-core FLOP/s (fp32 accumulate)
    tf32: float  # dense TF32 FLOP/s (0: none)
    fp32: float  # CUDA-core float32 FLOP/s
    hbm: float  # memory bandwidth, bytes/s
    width_half: float  # model width at which GEMMs reach ~half of their best rate
    knee: float  # micro-batch positions at which GEMMs reach half of their best rate
    attention: dict[str, float]  # fused attention kernels' share of the tensor peak (fwd + bwd)
    launch_s: float  # host seconds per eager kernel launch (Python, dispatcher, driver)
    vcpus: int
    cpu: str
    driver: str
    cuda: str
    mm_eff: float = 0.80  # the best share of the tensor peak cuBLAS reaches on 16-bit GEMMs


GPUS = {
    "h100-pcie": Gpu(
        "NVIDIA H100 PCIe", "9.0", 85_520_809_984, 756e12, 378e12, 51e12, 2.0e12, 560, 2600,
        {"flash": 0.30, "efficient": 0.17, "cudnn": 0.52}, 7e-6, 32, "AMD EPYC 9334 (modelled)",
        "560.35.03", "12.6",
    ),
    "rtx-a5000": Gpu(
        "NVIDIA RTX A5000", "8.6", 25_757_220_864, 111e12, 55.5e12, 27.8e12, 768e9, 300, 1100,
        {"flash": 0.52, "efficient": 0.36, "cudnn": 0.46}, 9e-6, 16, "Intel Xeon W-2255 (modelled)",
        "550.90.07", "12.4",
    ),
    "l40s": Gpu(
        "NVIDIA L40S", "8.9", 48_305_799_168, 362e12, 181e12, 91.6e12, 864e9, 420, 2200,
        {"flash": 0.44, "efficient": 0.29, "cudnn": 0.40}, 8e-6, 48, "AMD EPYC 7R13 (modelled)",
        "550.90.07", "12.4",
    ),
    "a10g": Gpu(
        "NVIDIA A10G", "8.6", 24_146_608_128, 70e12, 35e12, 31.2e12, 600e9, 260, 1000,
        {"flash": 0.55, "efficient": 0.40, "cudnn": 0.48}, 11e-6, 4, "AMD EPYC 7R32, 4 vCPUs (modelled)",
        "550.90.07", "12.4",
    ),
    "v100-16gb": Gpu(
        "Tesla V100-SXM2-16GB", "7.0", 16_945_512_448, 125e12, 0.0, 15.7e12, 900e9, 450, 1300,
        {"efficient": 0.26}, 12e-6, 40, "Intel Xeon E5-2698 v4 (modelled)", "535.183.01", "12.2", mm_eff=0.70,
    ),
}  # fmt: skip


@dataclass(frozen=True)
class Host:
    """A DataLoader that tokenizes text on the fly (host-bound): what one vCPU supplies."""

    rate: float = 13_000.0  # tokens/s one worker tokenizes and packs on one vCPU
    batch_s: float = 0.012  # per batch: collate, pickle through the queue
    thrash: float = 0.10  # oversubscription's loss: context switches, caches, the tokenizer's own threads
    pin_cpu: float = 0.12  # the pin-memory thread's share of a vCPU
    sync_copy_s: float = 0.0015  # unpinned: a synchronous pageable copy stalls the queue each step
    main_cpu: float = 0.6  # the main process's share of a vCPU when it only waits on the GPU


@dataclass(frozen=True)
class Landscape:
    name: str
    model: str
    gpu: str
    space: str  # spaces/<space>.yaml
    seed: int
    about: str
    noise: float = 0.012  # sigma of a measurement's log tokens/s
    peak_jitter: float = 0.003  # sigma of the measured peak (relative)
    step_fixed_s: float = 0.0015  # per step, not scaled by the budget (sync, the host restarting the queue)
    # compile_mode max-autotune(-no-cudagraphs) against default at the same scope: the step's
    # relative change, drawn per shape from this range (negative: faster)
    autotune: dict[str, tuple[float, float]] = field(
        default_factory=lambda: {"blocks": (-0.02, 0.0), "blocks+head": (-0.025, -0.005), "model": (-0.035, -0.01)}
    )
    # compiled padded batches (dynamic shapes): GPU time lost in the compiled regions, by scope
    dynamic: dict[str, float] = field(default_factory=lambda: {"blocks": 0.03, "blocks+head": 0.035, "model": 0.045})
    cudnn_breaks_graph: bool = False  # torch.compile cannot trace the cuDNN attention call
    host: Host | None = None
    throttled: float = 0.0  # share of measured configurations recorded 10-25 % low
    crashed: float = 0.0  # share of run configurations that crashed (weighted to compiled ones)
    timed_out: float = 0.0  # ... and that hit the trial timeout
    act_bytes: float = 34.0  # activation bytes per position per block per unit of width (16-bit)
    compiled_act: float = 0.82  # the share of them a compiled block saves (the rest recomputed)
    logits_bytes: float = 10.0  # the standard loss's bytes per logit, eager 16-bit
    chunk_tokens: int = 4096  # the chunked loss's slice, in positions


INTERACTING_AUTOTUNE = {"blocks": (0.03, 0.06), "blocks+head": (0.03, 0.06), "model": (-0.065, -0.04)}
INTERACTING_DYNAMIC = {"blocks": 0.025, "blocks+head": 0.035, "model": 0.085}

LANDSCAPES = [
    Landscape(
        "interacting", "gpt2-medium", "h100-pcie", "base", 11,
        "gpt2-medium on an H100 PCIe 80 GB: compile mode x scope, cuDNN x compile, padding x scope interact",
        autotune=INTERACTING_AUTOTUNE, dynamic=INTERACTING_DYNAMIC, cudnn_breaks_graph=True,
    ),
    Landscape(
        "edge", "gpt2", "rtx-a5000", "edge", 23,
        "gpt2 on an RTX A5000 24 GB: throughput rises with the budget up to the largest that fits",
        noise=0.008, peak_jitter=0.0, step_fixed_s=0.15,
        act_bytes=30.1, compiled_act=0.80, logits_bytes=10.4, chunk_tokens=2048,  # --calibrate edge
        autotune={"blocks": (-0.012, -0.006), "blocks+head": (-0.014, -0.008), "model": (-0.022, -0.016)},
    ),
    Landscape(
        "heavy-tail", "gpt2-medium", "l40s", "base", 37,
        "gpt2-medium on an L40S 48 GB: 5 % of records measured 10-25 % low, 1 % crashed or timed out",
        throttled=0.05, crashed=0.007, timed_out=0.003,
    ),
    Landscape(
        "host-bound", "gpt2", "a10g", "host", 41,
        "gpt2 on an A10G behind 4 vCPUs tokenizing text on the fly: the DataLoader binds",
        host=Host(),
    ),
    Landscape(
        "pre-ampere", "gpt2", "v100-16gb", "base", 53,
        "gpt2 on a V100 SXM2 16 GB: float16 only, no flash or cuDNN attention",
        autotune={"blocks": (0.0, 0.03), "blocks+head": (0.0, 0.03), "model": (-0.015, 0.01)},
    ),
]  # fmt: skip
BY_NAME = {land.name: land for land in LANDSCAPES}


def _rng(land: Landscape, what: str, key: str) -> random.Random:
    digest = hashlib.sha256(f"shapes|{land.name}|{land.seed}|{what}|{key}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "little"))


def _soft_max(a: float, b: float, k: float = 4.0) -> float:
    return (a**k + b**k) ** (1.0 / k)


def _soft_min(a: float, b: float, k: float) -> float:
    return (a ** (-k) + b ** (-k)) ** (-1.0 / k)


def n_params(model: str) -> tuple[float, float]:
    """(all parameters, those in matmuls) of a GPT-2 with tied embeddings."""
    n_layer, d, _ = MODELS[model]
    blocks = 12 * n_layer * d * d + 13 * n_layer * d
    return blocks + VOCAB * d + SEQ * d + 2 * d, 12 * n_layer * d * d + VOCAB * d


@dataclass
class Estimate:
    """What the model says of one runnable configuration, before any measurement noise."""

    gpu_s: float
    host_s: float
    step_s: float  # one training step, data included
    tokens: float  # non-pad tokens per step
    pad: float
    peak: float  # bytes
    data_wait: float  # share of the step spent waiting for the next batch
    compile_s: float
    process_s: float


# --------------------------------------------------------------------------- the step


def _gpu_time(land: Landscape, c: dict[str, Any], mode: str, *, broken: bool) -> tuple[float, float]:
    """(GPU seconds, host seconds) of one step of configuration `c` run in compile `mode`
    (max-autotune is priced as default here; `step` applies its ratio)."""
    gpu = GPUS[land.gpu]
    n_layer, d, heads = MODELS[land.model]
    budget, dt, backend = c["token_budget"], c["amp_dtype"], c["sdpa_backend"]
    half = dt in HALF
    padded = c["batching"] == "padded"
    compiled = mode != "none"
    graphs = mode in ("reduce-overhead", "max-autotune")
    scope = c["compile_scope"] if compiled else None
    head_compiled = scope in ("blocks+head", "model")
    chunked = c["loss_impl"] == "chunked"
    n_ck = len(c["checkpoint_layers"])
    n_all, _ = n_params(land.model)
    row = SEQ * (0.62 if padded else 1.0)  # attention's row length: padded rows are whole documents

    peak = {"float16": gpu.tensor, "bfloat16": gpu.tensor, "tf32": gpu.tf32 or gpu.fp32, "float32": gpu.fp32}[dt]
    eff = {"float16": gpu.mm_eff, "bfloat16": gpu.mm_eff, "tf32": 0.72, "float32": 0.85}[dt]
    if dt == "tf32" and not gpu.tf32:
        eff = 0.85
    sat = budget / (budget + gpu.knee)
    width = 1.0 / (1.0 + (gpu.width_half / d) ** 1.5)
    t_mm = 6 * budget * 12 * n_layer * d * d / (peak * eff * sat * width)
    t_head = 6 * budget * VOCAB * d / (peak * eff * sat) * (1.04 if chunked else 1.0)

    if backend == "math":
        score_bytes = (18 if compiled else 40) if half else (30 if compiled else 64)
        t_attn = 12 * budget * row * d * n_layer / (peak * eff * sat * width * 0.6)
        t_attn += n_layer * budget * row * heads * score_bytes / (gpu.hbm * 0.75)
        attn_fwd = 1 / 3
    else:
        rate = gpu.tensor * gpu.attention[backend] if half else gpu.fp32 * 0.45  # efficient runs fp32
        t_attn = 7 * budget * row * d * n_layer / (rate * budget / (budget + 0.5 * gpu.knee))
        attn_fwd = 2 / 7

    share = 1.0
    if compiled:
        share = 0.33 if scope == "model" else 0.36
        if broken:  # the graph splits around each attention call: its neighbours stay unfused
            share += 0.22 if scope == "model" else 0.17
    ew_bytes = (230 if half else 320) * share
    t_ew = n_layer * budget * d * ew_bytes / (gpu.hbm * (0.82 if compiled else 0.70))
    loss_bytes = (10 if half else 12) * (1.1 if chunked else 1.0) if head_compiled else (28 if half else 32)
    t_loss = budget * VOCAB * loss_bytes / (gpu.hbm * 0.8)
    t_opt = n_all * 28 / (gpu.hbm * 0.85) + 0.0004
    if dt == "float16":  # the GradScaler: unscale, the inf check, its host sync
        t_opt += n_all * 6 / (gpu.hbm * 0.85) + 0.0003
    t_recompute = n_ck / n_layer * (t_mm / 3 + t_attn * attn_fwd + t_ew * 0.4)

    if compiled and padded:  # dynamic shapes: kernels not specialised to one width
        dyn = land.dynamic[scope]
        t_mm, t_attn, t_ew, t_recompute = (x * (1 + dyn) for x in (t_mm, t_attn, t_ew, t_recompute))
        if head_compiled:
            t_head, t_loss = t_head * (1 + dyn), t_loss * (1 + dyn)

    slices = math.ceil(budget / 4096)
    per_block = (16 if scope == "model" else 18) if compiled else 60 + 8 * (backend == "math")
    if broken:
        per_block += 6
    head_k = (6 + 4 * slices if chunked else 6) if head_compiled else (8 + 10 * slices if chunked else 22)
    opt_k = 6 + 12 * (dt == "float16")
    block_k = n_layer * per_block + n_ck * per_block * 0.4
    gap = 0.4e-6 if graphs else (1.6e-6 if compiled else 2.2e-6)
    eager_gap = gap if (graphs and head_compiled) else 2.2e-6
    t_gpu = t_mm + t_head + t_attn + t_ew + t_loss + t_opt + t_recompute + block_k * gap + (head_k + opt_k) * eager_gap
    if graphs and scope != "model":  # each block graph copies its inputs into its static buffers
        t_gpu += n_layer * 2 * budget * d * 4 * 3 / (gpu.hbm * 0.8)
    if dt == "float16":
        t_gpu *= 1.01

    eager_head = 0 if head_compiled else head_k
    if not compiled:
        host = (block_k + head_k + opt_k) * gpu.launch_s
    else:
        calls = {"blocks": n_layer, "blocks+head": n_layer + 1, "model": 1}[scope]
        if broken:  # the pieces between the attention calls, and the calls themselves, eager
            calls = 2 * n_layer + (1 if scope == "model" else 0)
            eager_head += 4 * n_layer
        if 0 < n_ck < n_layer and scope != "model":
            calls += n_ck
        if graphs:
            host = calls * 2 * 22e-6 + (eager_head + opt_k) * gpu.launch_s
        else:
            host = calls * 2 * 50e-6 + block_k * 3.5e-6 + (eager_head + opt_k) * gpu.launch_s
    host += 0.0006  # zero_grad, the optimizer's Python, the step's bookkeeping
    return t_gpu, host


def step(land: Landscape, c: dict[str, Any]) -> tuple[float, float, float]:
    """(step seconds without data, GPU seconds, host seconds). max-autotune and
    max-autotune-no-cudagraphs are priced as default, then moved by the landscape's ratio."""
    mode = c["compile_mode"]
    broken = land.cudnn_breaks_graph and mode != "none" and c["sdpa_backend"] == "cudnn"
    autotuned = mode in ("max-autotune", "max-autotune-no-cudagraphs")
    t_gpu, host = _gpu_time(land, c, "default" if autotuned else mode, broken=broken)
    s = _soft_max(t_gpu, host) + land.step_fixed_s
    if autotuned:
        # Autotuned GEMM templates with fused epilogues pay across a whole-model graph; chosen per
        # block graph (benchmarked in isolation, each graph its own pool and input copies) they
        # lose. A graph broken at every attention call is per-block, whatever the scope says.
        scope = "blocks" if broken else c["compile_scope"]
        shape = f"{c['token_budget']}|{c['amp_dtype']}|{c['sdpa_backend']}|{scope}|{c['loss_impl']}"
        lo, hi = land.autotune[scope]
        s *= 1.0 + _rng(land, "autotune", shape).uniform(lo, hi)
    return s, t_gpu, host


def pad_fraction(c: dict[str, Any]) -> float:
    if c["batching"] != "padded":
        return 0.0
    return 0.095 - 0.007 * math.log2(c["token_budget"] / 8192)  # length-grouped: 9.5 % at 8k, 6.7 % at 128k


def data(land: Landscape, c: dict[str, Any], s: float, t_gpu: float, host: float) -> tuple[float, float]:
    """(step seconds with data loading, share of it waiting for data), from the step without
    data `s` and its GPU and host parts."""
    workers, budget = c["num_workers"], c["token_budget"]
    h = land.host
    if h is None:  # pre-tokenized ids: cheap to batch; without workers the main process does it, serially
        wait = budget / 40e6 + 0.0003 if workers == 0 else 0.0
        return s + wait, wait / (s + wait)
    vcpus = GPUS[land.gpu].vcpus
    per_batch = budget / h.rate + h.batch_s  # one vCPU's seconds to tokenize and pack one batch
    if workers == 0:  # the main process tokenizes between steps: serial
        total = s + per_batch + (0.0 if c["pin_memory"] else h.sync_copy_s)
        return total, per_batch / total
    # the main process: its Python and launches, and the CUDA driver spin-waiting at each step's
    # sync (most of a vCPU while it waits)
    main = h.main_cpu + (1.0 - h.main_cpu) * min(1.0, host / s)
    demand = workers + main + (h.pin_cpu if c["pin_memory"] else 0.0)
    over = max(0.0, demand - vcpus)
    share = min(1.0, vcpus / demand) * math.exp(-h.thrash * over**1.5)
    supply_s = per_batch / (workers * share)  # seconds between batches the workers deliver
    # the main process, descheduled as often, launches slower: launch-bound steps stretch
    gpu_s = s + _soft_max(t_gpu, host / share) - _soft_max(t_gpu, host)
    if not c["pin_memory"]:
        gpu_s += h.sync_copy_s
    # the queue (workers x prefetch batches deep) absorbs the spread of batch times: deeper, a
    # harder minimum of the two rates
    k = 2.0 + 1.5 * math.sqrt(workers * c["prefetch_factor"])
    total = _soft_min(1.0 / gpu_s, 1.0 / supply_s, k) ** -1.0
    return total, max(0.0, 1.0 - gpu_s / total)


# --------------------------------------------------------------------------- memory


def peak_bytes(land: Landscape, c: dict[str, Any]) -> float:
    """The step's peak as NVML sees it: static + dynamic x fragmentation, dynamic linear in the
    budget (the chunked loss's slice is one constant)."""
    n_layer, d, heads = MODELS[land.model]
    budget, dt, backend, mode = c["token_budget"], c["amp_dtype"], c["sdpa_backend"], c["compile_mode"]
    half = dt in HALF
    compiled = mode != "none"
    scope = c["compile_scope"] if compiled else None
    head_compiled = scope in ("blocks+head", "model")
    padded = c["batching"] == "padded"
    n_ck = len(c["checkpoint_layers"])
    n_all, n_mm = n_params(land.model)
    # worst-case shapes (full rows) for the activations: the measuring loop runs them
    static = 16 * n_all + (2 * n_mm if half else 0) + 0.52 * GB  # weights, grads, Adam; bf16 casts; context
    layer = (land.act_bytes * 1.06 if half else 2 * land.act_bytes) * d * (land.compiled_act if compiled else 1.0)
    if backend == "math":
        layer += heads * SEQ * (6 if half else 8) * (0.75 if compiled else 1.0)
    else:
        layer += heads * 8
    act = budget * ((n_layer - n_ck) * layer + n_ck * 4 * d)
    if c["loss_impl"] == "chunked":
        logits = land.chunk_tokens * VOCAB * 12 + budget * d * 4
    else:
        per_logit = land.logits_bytes * (0.6 if head_compiled else 1.0) if half else 1.2 * land.logits_bytes
        logits = budget * VOCAB * per_logit
    dynamic = max(act + logits + budget * d * 10, act + budget * layer if n_ck else 0.0)
    if mode in ("reduce-overhead", "max-autotune"):  # CUDA graph trees' private pool
        dynamic += (0.25 if scope == "model" else 0.4) * act + 0.5 * GB
    if mode in ("max-autotune", "max-autotune-no-cudagraphs"):
        dynamic += 0.6 * GB  # autotuning's benchmark buffers
    if backend == "cudnn":
        dynamic += budget * heads * 48
    return static + dynamic * (1.06 if padded else 1.015)


# --------------------------------------------------------------------------- costs


def compile_seconds(land: Landscape, c: dict[str, Any]) -> float:
    mode = c["compile_mode"]
    if mode == "none":
        return 0.0
    n_layer, d, _ = MODELS[land.model]
    scope = c["compile_scope"]
    base = {"blocks": 42.0, "blocks+head": 58.0, "model": 22.0 + 2.8 * n_layer}[scope] * (d / 768) ** 0.3
    if mode in ("max-autotune", "max-autotune-no-cudagraphs"):
        base += 130.0 * {"blocks": 1.0, "blocks+head": 1.15, "model": 1.45}[scope]
    if mode in ("max-autotune", "reduce-overhead"):
        base += 5.0 + 0.25 * n_layer
    if c["batching"] == "padded":
        base *= 1.8 if scope == "model" else 1.5  # recompiles for dynamic widths
    n_ck = len(c["checkpoint_layers"])
    if 0 < n_ck < n_layer and scope != "model":
        base *= 1.6  # a second block graph
    elif n_ck:
        base *= 1.12
    if land.cudnn_breaks_graph and c["sdpa_backend"] == "cudnn":
        base *= 1.25  # many graph pieces
    return base


def estimate(land: Landscape, c: dict[str, Any]) -> Estimate:
    s, t_gpu, host = step(land, c)
    total, wait = data(land, c, s, t_gpu, host)
    tokens = c["token_budget"] * (1 - pad_fraction(c))
    n_all, _ = n_params(land.model)
    process = 11.0 + 2.2 * n_all / 1e9 + (0.8 + 0.25 * c["num_workers"] if c["num_workers"] else 0.0)
    return Estimate(
        t_gpu, host, total, tokens, pad_fraction(c), peak_bytes(land, c), wait, compile_seconds(land, c), process
    )


# --------------------------------------------------------------------------- records

CRASHES = (
    "RuntimeError: CUDA error: an illegal memory access was encountered (modelled)",
    "torch._inductor.exc.InductorError: a Triton kernel failed to compile (modelled)",
    "the trial process died with signal SIGSEGV (modelled)",
)


def _unsupported(reason: str) -> dict[str, Any]:
    return {
        "outcome": "unsupported",
        "reason": reason,
        "tokens_per_sec": None,
        "peak_memory_bytes": None,
        "step_time_cv": None,
        "data_wait_fraction": None,
        "padding_fraction": None,
        "process_s": 0.0,
        "compile_s": 0.0,
        "timed_s": 0.0,
        "wall_s": 0.0,
    }


def _failed(outcome: str, reason: str, process: float, compile_s: float, timed: float) -> dict[str, Any]:
    return {
        "outcome": outcome,
        "reason": reason,
        "tokens_per_sec": None,
        "peak_memory_bytes": None,
        "step_time_cv": None,
        "data_wait_fraction": None,
        "padding_fraction": None,
        "process_s": round(process, 2),
        "compile_s": round(compile_s, 2),
        "timed_s": round(timed, 2),
        "wall_s": round(process + compile_s + timed, 2),
    }


def measured_step(land: Landscape, c: dict[str, Any], key: str, est: Estimate) -> tuple[float, float]:
    """(the step time this configuration's measurement recorded, CV added by a shared GPU): the
    model's step moved by the measurement's noise, and for a throttled record 10-25 % slower."""
    s = est.step_s * math.exp(_rng(land, "noise", key).gauss(0.0, land.noise))
    if not land.throttled or _rng(land, "throttle", key).random() >= land.throttled:
        return s, 0.0
    # a throttled card (clocks down: as steady as ever) or a shared one (another process's
    # kernels interleave: a noisy window)
    t = _rng(land, "throttle-by", key)
    s /= t.uniform(0.75, 0.90)
    return s, (t.uniform(0.05, 0.15) if t.random() < 0.5 else 0.0)


def record(land: Landscape, c: dict[str, Any], key: str) -> dict[str, Any]:
    """One runnable configuration's record fields (outcome .. wall_s)."""
    gpu = GPUS[land.gpu]
    est = estimate(land, c)
    rng = _rng(land, "measure", key)
    process = est.process_s * math.exp(rng.gauss(0.0, 0.05))
    compile_s = est.compile_s * math.exp(rng.gauss(0.0, 0.07))
    if est.peak > gpu.memory * 0.985:
        need = est.peak / 2**30
        reason = f"CUDA out of memory: the step needs about {need:.1f} GiB of {gpu.memory / 2**30:.1f} GiB (modelled)"
        return _failed("oom", reason, process + 2 * est.step_s, 0.6 * compile_s, 0.0)
    fate = _rng(land, "fate", key).random()
    weight = 2.0 if c["compile_mode"] != "none" else 0.5  # compiled runs fail more often
    if fate < land.timed_out * weight:  # killed at the trial timeout: all process, as record_sweep splits it
        return _failed("timeout", f"trial timed out after {TRIAL_TIMEOUT_S:.0f} s (modelled)", TRIAL_TIMEOUT_S, 0, 0)
    if fate < (land.timed_out + land.crashed) * weight:
        died = process + compile_s * rng.uniform(0.3, 1.0) + rng.uniform(0.0, 5.0)
        return _failed("crashed", CRASHES[int(fate * 1e6) % len(CRASHES)], died, 0.0, 0.0)

    cv = 0.006 + (0.035 if c["batching"] == "padded" else 0.0) + 0.004 * (c["amp_dtype"] == "float16")
    cv += 0.12 * est.data_wait + (0.01 if c["num_workers"] == 0 else 0.0)
    cv *= rng.uniform(0.75, 1.3)
    s, shared = measured_step(land, c, key, est)
    cv += shared
    steps = max(RUN["steps"], RUN["min_time_s"] / s) * (2 if cv > CV_SECOND_WINDOW else 1)
    timed = (steps + RUN["warmup"] + (2 if c["batching"] == "padded" else 0)) * s
    peak = est.peak * (1.0 + rng.gauss(0.0, land.peak_jitter)) if land.peak_jitter else est.peak
    return {
        "outcome": "ok",
        "reason": None,
        "tokens_per_sec": round(est.tokens / s, 1),
        "peak_memory_bytes": _nvml(peak),
        "step_time_cv": round(cv, 4),
        "data_wait_fraction": round(est.data_wait, 4),
        "padding_fraction": round(est.pad * math.exp(rng.gauss(0.0, 0.03)), 4) if est.pad else 0.0,
        "process_s": round(process, 2),
        "compile_s": round(compile_s, 2),
        "timed_s": round(timed, 2),
        "wall_s": round(process + compile_s + timed, 2),
    }


def _nvml(peak: float) -> int:
    """A peak as NVML reports it: a multiple of 2 MiB."""
    return int(round(peak / (2 * MIB))) * 2 * MIB


def space_file(land: Landscape) -> Path:
    return HERE / "spaces" / f"{land.space}.yaml"


def build(land: Landscape) -> dict[str, Any]:
    """The landscape as the sweep dict (record_sweep.py's format, version 2)."""
    import yaml

    gpu = GPUS[land.gpu]
    n_layer = MODELS[land.model][0]
    path = space_file(land)
    space = load_space(path, n_layer=n_layer, seq_len=SEQ)
    major, minor = (int(x) for x in gpu.cc.split("."))
    caps = DeviceCapabilities("cuda", (major, minor), has_triton=True)
    records = []
    for params, cfg in enumerate_space(space):
        config = cfg.to_dict()
        key = config_key(cfg)
        reason = space.violation(cfg) or _device_refuses(cfg, caps)
        fields = _unsupported(reason) if reason is not None else record(land, config, key)
        records.append({"params": params, "config": config, "key": key, **fields})
    return {
        "format": "autotune.sweep",
        "version": 2,
        "created": CREATED,
        "model": land.model,
        "device": {
            "kind": "cuda",
            "name": gpu.name,
            "uuid": None,
            "index": 0,
            "total_memory_bytes": gpu.memory,
            "compute_capability": gpu.cc,
            "driver": gpu.driver,
            "cuda": gpu.cuda,
            "torch": "2.13.0 (modelled)",
            "cpu_count": gpu.vcpus,
        },
        "machine": {
            "host": f"analytic model (benchmarks/shapes/generate.py: {land.name})",
            "cpu": gpu.cpu,
            "cores": gpu.vcpus,
            "torch": "2.13.0 (modelled)",
            "python": "3.11 (modelled)",
        },
        "run": dict(RUN),
        "space": yaml.safe_load(path.read_text(encoding="utf-8")),
        "space_source": f"benchmarks/shapes/spaces/{land.space}.yaml",
        "space_hash": space.hash,
        "n_layer": n_layer,
        "seq_len": SEQ,
        "complete": True,
        "synthetic": True,
        "landscape": {
            "name": land.name,
            "about": land.about,
            "seed": land.seed,
            "generator": "benchmarks/shapes/generate.py",
            "model_version": MODEL_VERSION,
        },
        "configurations": records,
    }


def _device_refuses(cfg: TrainConfig, caps: DeviceCapabilities) -> str | None:
    """What the registry's device rules refuse on this GPU (pre-Ampere: bf16, tf32, flash,
    cuDNN attention), as record_sweep.rejection records it."""
    try:
        check_supported(cfg, caps)
    except UnsupportedConfig as exc:
        return str(exc)
    return None


def write(land: Landscape, data: dict[str, Any]) -> Path:
    path = HERE / f"{land.name}.json.gz"
    payload = json.dumps(data, separators=(",", ":")).encode("utf-8")
    with open(path, "wb") as fh:  # mtime 0, no name: the same bytes on every run
        with gzip.GzipFile(filename="", mode="wb", fileobj=fh, compresslevel=9, mtime=0) as gz:
            gz.write(payload)
    return path


# --------------------------------------------------------------------------- calibration


def calibrate(land: Landscape, samples: int = 1000, seed: int = 1, show: int = 10) -> list[str]:
    """How the edge landscape's memory constants were chosen: `samples` draws (seeded) of the
    activation bytes per position, the share a compiled block saves, the standard loss's bytes
    per logit and the chunked loss's slice, each within a plausible range; for each, where the
    best feasible configuration sits under each quantile limit (the throughputs do not depend on
    these constants). Lines for the `show` draws that put the most limits' best 1-3 % under."""
    from _replay import memory_limit

    n_layer = MODELS[land.model][0]
    space = load_space(space_file(land), n_layer=n_layer, seq_len=SEQ)
    runs = []  # (config, measured tokens/s) of every configuration the space's rules allow
    for _, cfg in enumerate_space(space):
        if space.violation(cfg) is None:
            c, key = cfg.to_dict(), config_key(cfg)
            est = estimate(land, c)
            runs.append((c, est.tokens / measured_step(land, c, key, est)[0]))
    usable = GPUS[land.gpu].memory * 0.985
    rng = random.Random(seed)
    scored = []
    for _ in range(samples):
        values = {
            "act_bytes": round(rng.uniform(30, 38), 1),
            "compiled_act": round(rng.uniform(0.75, 0.9), 2),
            "logits_bytes": round(rng.uniform(8, 12), 1),
            "chunk_tokens": rng.choice([2048, 4096, 8192]),
        }
        trial = dataclasses.replace(land, **values)
        ok = [{"outcome": "ok", "tokens_per_sec": tps, "peak_memory_bytes": _nvml(pk)} for c, tps in runs
              if (pk := peak_bytes(trial, c)) <= usable]  # fmt: skip
        gaps = []
        for q in QUANTILES:
            limit = memory_limit(ok, q)
            top = max((r for r in ok if r["peak_memory_bytes"] <= limit), key=lambda r: r["tokens_per_sec"])
            gaps.append((limit - top["peak_memory_bytes"]) / limit)
        hits = sum(0.01 <= g <= 0.03 for g in gaps)
        scored.append((-hits, sum(abs(g - 0.02) for g in gaps), values, gaps))
    scored.sort(key=lambda s: (s[0], s[1]))
    return [f"{-h} of {len(QUANTILES)}: {v} gaps {' '.join(f'{g:.1%}' for g in gs)}" for h, _, v, gs in scored[:show]]


# --------------------------------------------------------------------------- summary


def _short(p: dict[str, Any]) -> str:
    keys = ("token_budget", "batching", "amp_dtype", "sdpa_backend", "compile_mode", "compile_scope", "loss_impl")
    parts = [str(p[k]) for k in keys if k in p]
    parts.append(f"ckpt{p.get('checkpoint_count', 0)}")
    if "num_workers" in p:
        parts.append(f"w{p['num_workers']}" + (f"pf{p['prefetch_factor']}" if "prefetch_factor" in p else ""))
    if "pin_memory" in p:
        parts.append("pin" if p["pin_memory"] else "nopin")
    return " ".join(parts)


def summary(data: dict[str, Any], path: str) -> list[str]:
    from _replay import Sweep, measured, memory_limit

    sweep = Sweep.from_dict(data, path)
    recs = sweep.records
    counts: dict[str, int] = {}
    for r in recs:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    ok = [r for r in recs if measured(r)]
    best = max(ok, key=lambda r: r["tokens_per_sec"])
    lines = [
        f"{path}: {len(recs)} configurations {counts}",
        f"  best {best['tokens_per_sec']:,.0f} tok/s at {best['peak_memory_bytes'] / 2**30:.1f} GiB: "
        + _short(best["params"]),
    ]
    for q in QUANTILES:
        limit = memory_limit(recs, q)
        feasible = [r for r in ok if r["peak_memory_bytes"] <= limit]
        top = max(feasible, key=lambda r: r["tokens_per_sec"])
        near = sum(r["tokens_per_sec"] >= (1 - TOLERANCE) * top["tokens_per_sec"] for r in feasible)
        gap = (limit - top["peak_memory_bytes"]) / limit
        lines.append(
            f"  q{q}: limit {limit / 2**30:.2f} GiB, best {top['tokens_per_sec']:,.0f} tok/s "
            f"{gap:.1%} under it, {near} within 3 %: {_short(top['params'])}"
        )
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", action="append", choices=sorted(BY_NAME), help="a landscape (repeatable)")
    p.add_argument("--check", action="store_true", help="summarise the written files, write nothing")
    p.add_argument("--no-write", action="store_true", help="build and summarise, write nothing")
    p.add_argument("--calibrate", choices=sorted(BY_NAME), help="search a landscape's memory constants (see calibrate)")
    args = p.parse_args()
    if args.calibrate:
        for line in calibrate(BY_NAME[args.calibrate]):
            print(line)
        return 0
    for land in LANDSCAPES:
        if args.only and land.name not in args.only:
            continue
        path = HERE / f"{land.name}.json.gz"
        if args.check:
            with gzip.open(path, "rt", encoding="utf-8") as fh:
                data = json.load(fh)
        else:
            data = build(land)
            if not args.no_write:
                write(land, data)
        for line in summary(data, str(path.relative_to(BENCH.parent))):
            print(line)
        if path.exists() and not args.no_write:
            print(f"  file {path.stat().st_size / 2**20:.2f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
