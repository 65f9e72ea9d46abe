"""Synthetic "holdout" landscapes: every configuration of benchmarks/holdout/space.yaml, with an
outcome, throughput, peak memory and trial cost from an analytic model of one GPU.

    python benchmarks/holdout/generate.py              # write every landscape, print the summary
    python benchmarks/holdout/generate.py --only NAME  # one landscape
    python benchmarks/holdout/generate.py --check      # summarise the files already written

The model here was written independently of benchmarks/landscapes/ (not read), so that the tuner
can be checked on landscapes its authors did not tune to. It is a model, not a measurement: the
files say `synthetic: true`. Deterministic: every number comes from the landscape's seed and the
configuration's key (hashed), not from the order of enumeration.

Standard library plus the checkout's space loader and benchmarks/_common.py."""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import math
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import _common  # noqa: E402,F401  (puts the checkout on sys.path)
from _common import config_key, enumerate_space  # noqa: E402

from autotune.space.file import load_space  # noqa: E402

SPACE = HERE / "space.yaml"
VOCAB = 50304
SEQ = 1024
GB = 1e9
MODELS = {  # name: (n_layer, n_head, n_embd)
    "gpt2": (12, 12, 768),
    "gpt2-medium": (24, 16, 1024),
    "gpt2-large": (36, 20, 1280),
    "gpt2-xl": (48, 25, 1600),
}
HALF = ("float16", "bfloat16")


@dataclass(frozen=True)
class Device:
    name: str
    cc: str
    total_bytes: int
    peak: dict[str, float]  # dense FLOP/s per amp dtype (fp32 without tensor cores)
    bw: float  # HBM bytes/s
    mm_eff: dict[str, float]  # best GEMM efficiency per dtype
    d0: float  # width at which GEMMs reach half their best efficiency
    m0: float  # tokens at which GEMMs reach half their best efficiency
    attn_eff: dict[str, float]  # fused attention kernels' efficiency (half precision)
    autotune: float  # GEMM speed factor from max-autotune templates
    cpu: float  # host launch cost factor (1: a typical server core)
    cpu_count: int
    driver: str
    cuda: str
    cudnn_attention: bool
    cudnn_graphs: bool  # cuDNN attention inside CUDA graphs
    cudnn_ws: float  # cuDNN attention workspace, bytes per token and head
    sms: int  # streaming multiprocessors: GEMM tiles run in waves of this many


A100 = Device(
    name="NVIDIA A100-SXM4-80GB",
    cc="8.0",
    total_bytes=85_097_971_712,
    peak={"float32": 19.5e12, "tf32": 156e12, "float16": 312e12, "bfloat16": 312e12},
    bw=2.04e12,
    mm_eff={"float32": 0.86, "tf32": 0.66, "float16": 0.70, "bfloat16": 0.70},
    d0=420,
    m0=1400,
    attn_eff={"flash": 0.56, "efficient": 0.36, "cudnn": 0.50},
    autotune=1.035,
    cpu=1.0,
    cpu_count=32,
    driver="535.161.08",
    cuda="12.2",
    cudnn_attention=True,
    cudnn_graphs=False,
    cudnn_ws=900.0,
    sms=108,
)
RTX4090 = Device(
    name="NVIDIA GeForce RTX 4090",
    cc="8.9",
    total_bytes=25_390_809_088,
    peak={"float32": 82.6e12, "tf32": 82.6e12, "float16": 165.2e12, "bfloat16": 165.2e12},
    bw=1.008e12,
    mm_eff={"float32": 0.62, "tf32": 0.74, "float16": 0.76, "bfloat16": 0.76},
    d0=330,
    m0=900,
    attn_eff={"flash": 0.62, "efficient": 0.44, "cudnn": 0.0},
    autotune=1.045,
    cpu=0.72,
    cpu_count=16,
    driver="550.54.14",
    cuda="12.4",
    cudnn_attention=False,
    cudnn_graphs=False,
    cudnn_ws=0.0,
    sms=128,
)
H100 = Device(
    name="NVIDIA H100 80GB HBM3",
    cc="9.0",
    total_bytes=85_045_231_616,
    peak={"float32": 67e12, "tf32": 494.7e12, "float16": 989.4e12, "bfloat16": 989.4e12},
    bw=3.35e12,
    mm_eff={"float32": 0.80, "tf32": 0.62, "float16": 0.66, "bfloat16": 0.66},
    d0=760,
    m0=2600,
    attn_eff={"flash": 0.36, "efficient": 0.22, "cudnn": 0.52},
    autotune=0.982,
    cpu=0.95,
    cpu_count=26,
    driver="550.90.07",
    cuda="12.4",
    cudnn_attention=True,
    cudnn_graphs=True,
    cudnn_ws=96.0,
    sms=132,
)
H200 = Device(
    name="NVIDIA H200",
    cc="9.0",
    total_bytes=150_110_011_392,
    peak={"float32": 67e12, "tf32": 494.7e12, "float16": 989.4e12, "bfloat16": 989.4e12},
    bw=4.8e12,
    mm_eff={"float32": 0.80, "tf32": 0.60, "float16": 0.62, "bfloat16": 0.62},
    d0=760,
    m0=2600,
    attn_eff={"flash": 0.37, "efficient": 0.23, "cudnn": 0.53},
    autotune=1.004,
    cpu=0.88,
    cpu_count=24,
    driver="560.35.03",
    cuda="12.6",
    cudnn_attention=True,
    cudnn_graphs=True,
    cudnn_ws=96.0,
    sms=132,
)


def _waves(tokens: int, d: int, sms: int) -> float:
    """GEMM efficiency lost to the last, partly filled wave of 128x128 tiles, FLOP-weighted over
    a block's four matmuls and the head (cuBLAS' other tile shapes recover part of it)."""
    total = weighted = 0.0
    for n, k in ((3 * d, d), (d, d), (4 * d, d), (d, 4 * d), (VOCAB, d)):
        tiles = math.ceil(tokens / 128) * math.ceil(n / 128)
        fill = tiles / (math.ceil(tiles / sms) * sms)
        weighted += n * k * (1.0 - 0.6 * (1.0 - fill))
        total += n * k
    return weighted / total


@dataclass(frozen=True)
class Landscape:
    name: str
    model: str
    device: Device
    seed: int
    noise: float  # sigma of the multiplicative throughput noise
    about: str


LANDSCAPES = [
    Landscape("xl-a100-80gb", "gpt2-xl", A100, 1, 0.016, "gpt2-xl on an A100 SXM 80 GB"),
    Landscape("medium-rtx4090", "gpt2-medium", RTX4090, 5, 0.020, "gpt2-medium on an RTX 4090 24 GB"),
    Landscape("small-h100-80gb", "gpt2", H100, 37, 0.018, "gpt2 (124M) on an H100 SXM 80 GB"),
    Landscape("large-h200", "gpt2-large", H200, 10, 0.015, "gpt2-large on an H200 141 GB"),
]


def _rng(land: Landscape, key: str, what: str) -> random.Random:
    digest = hashlib.sha256(f"{land.seed}|{land.name}|{what}|{key}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "little"))


def _smooth_max(a: float, b: float, p: float = 4.0) -> float:
    return (a**p + b**p) ** (1.0 / p)


def _params(n_layer: int, d: int) -> tuple[float, float]:
    """(all parameters, those in matmuls)."""
    blocks = 12 * n_layer * d * d + 13 * n_layer * d
    return blocks + VOCAB * d + SEQ * d + 2 * d, 12 * n_layer * d * d + VOCAB * d


def simulate(land: Landscape, cfg: dict[str, Any]) -> dict[str, Any]:
    """One configuration's record fields (outcome .. wall_s), from the analytic model."""
    dev = land.device
    n_layer, n_head, d = MODELS[land.model]
    key = json.dumps(cfg, sort_keys=True)
    dt = cfg["amp_dtype"]
    half = dt in HALF
    mode = cfg["compile_mode"]
    compiled = mode != "none"
    graphs = mode in ("max-autotune", "reduce-overhead")
    scope = cfg["compile_scope"] if compiled else None
    head_compiled = scope in ("blocks+head", "model")
    backend = cfg["sdpa_backend"]
    padded = cfg["batching"] == "padded"
    workers = cfg["num_workers"]
    tokens = cfg["token_budget"]
    ckpt = list(cfg["checkpoint_layers"])
    n_ck = len(ckpt)
    partial = 0 < n_ck < n_layer
    chunked = cfg["loss_impl"] == "chunked"

    # Device-side refusals found at the first step (no process cost in a replay: unsupported).
    if backend == "cudnn" and not dev.cudnn_attention:
        return _unsupported(f"sdpa_backend=cudnn: no cuDNN attention engine for compute capability {dev.cc}")
    if backend == "cudnn" and graphs and not dev.cudnn_graphs:
        return _unsupported(
            f"sdpa_backend=cudnn: its backward cannot be captured in a CUDA graph on compute capability {dev.cc}"
        )
    if backend == "efficient" and dt == "float16" and mode == "max-autotune" and dev.cc.startswith("9"):
        return _unsupported("sdpa_backend=efficient: no float16 backward kernel for the autotuned layout on sm90")

    # --- the step's shape -------------------------------------------------------------------
    if padded:
        pad = 0.115 - 0.012 * math.log2(tokens / 4096)  # larger budgets group lengths better
        width = 0.58  # attention per position: rows are documents, shorter than the window
    else:
        pad, width = 0.0, 1.0
    tw = SEQ * width
    n_all, n_mm = _params(n_layer, d)
    block_share = 12 * n_layer * d * d / n_mm

    # --- GPU time ----------------------------------------------------------------------------
    sat = tokens / (tokens + dev.m0)
    wide = 1.0 / (1.0 + (dev.d0 / d) ** 1.6)
    eff_mm = dev.mm_eff[dt] * wide * sat / (1.0 / (1.0 + (dev.d0 / 1600) ** 1.6))
    eff_mm = min(eff_mm, 0.93) * _waves(tokens, d, dev.sms)
    if mode == "max-autotune":
        # autotuned templates: a gain where cuBLAS leaves some, a loss for narrow models on Hopper
        eff_mm *= dev.autotune * (1.0 + 0.012 * math.log2(d / 1024))
    if compiled and padded:
        eff_mm *= 0.965  # dynamic shapes: kernels not specialised to one width
    t_gemm = 6 * tokens * n_mm / (dev.peak[dt] * eff_mm)

    heads_elems = n_layer * tokens * tw * n_head  # attention scores per step
    eb = 2 if half else 4
    if backend == "math":
        bmm_peak = dev.peak[dt]
        t_attn_c = 3 * n_layer * 4 * tokens * tw * d / (bmm_peak * 0.42 * dev.mm_eff[dt] * sat)
        passes = 6 if compiled else 11
        t_attn_m = heads_elems * passes * eb / (dev.bw * 0.8)
        t_attn = t_attn_c + t_attn_m
        attn_fwd_share = 0.36
    else:
        if half:
            eff_a, peak_a = dev.attn_eff[backend], dev.peak[dt]
            if backend == "flash" and dt == "float16":
                eff_a *= 1.02
        else:  # efficient in fp32 (tf32 does not reach this kernel): CUDA cores
            eff_a, peak_a = 0.45, dev.peak["float32"]
        eff_a *= tokens / (tokens + 0.6 * dev.m0)
        t_attn = n_layer * 2 * tokens * tw * d * 3.5 / (peak_a * eff_a)
        attn_fwd_share = 1 / 3.5
    eb_pw = 2.7 if half else 4.0  # residual stream in fp32 under autocast
    pw_passes = (29 if scope == "model" else 24) if compiled else 62  # one graph: the partitioner recomputes more
    t_pw = n_layer * tokens * d * pw_passes * eb_pw / (dev.bw * 0.72)
    if head_compiled:
        ce_bytes = 15 if chunked else 11
    else:
        ce_bytes = (31 if half else 26) * (1.04 if chunked else 1.0)
    t_head = tokens * VOCAB * ce_bytes / (dev.bw * 0.8)
    t_opt = n_all * 28 / (dev.bw * 0.8) + 0.00012
    if dt == "float16":
        t_opt += n_all * 12 / (dev.bw * 0.8) + 0.00025  # GradScaler: unscale, inf check, its sync
    t_gemm_blocks = t_gemm * block_share
    t_recompute = (n_ck / n_layer) * (t_gemm_blocks / 3 + t_attn * attn_fwd_share + t_pw * 0.38)
    if partial and scope == "model":
        t_recompute *= 1.18  # min-cut recompute inside one graph: saves more, recomputes less well

    chunks = math.ceil(tokens / 2048)
    k_block = (22 if compiled else 62) + (4 if compiled else 10) * (backend == "math")
    k_head = (6 + 6 * chunks if chunked else 8) if head_compiled else (6 + 18 * chunks if chunked else 26)
    k_opt = 30 + 14 * (dt == "float16")
    n_kernels = n_layer * k_block + k_head + k_opt + n_ck * (0.45 * k_block + 6) + 12
    gap = 0.7e-6 if graphs else 2.4e-6
    gap_head = gap if (graphs and head_compiled) else 2.4e-6
    t_gpu = (
        t_gemm
        + t_attn
        + t_pw
        + t_head
        + t_opt
        + t_recompute
        + (n_kernels - k_head - k_opt) * gap
        + (k_head + k_opt) * gap_head
        + 12e-6 * n_ck
    )
    if graphs and scope != "model":
        t_gpu += n_layer * 2 * tokens * d * 4 / (dev.bw * 0.8)  # copying each block's input into its graph
    if backend == "cudnn" and dev.cc.startswith("8"):
        t_gpu += 0.00004 * n_layer  # plan building per call on sm80

    # --- CPU time (launching), data -----------------------------------------------------------
    if not compiled:
        t_cpu = n_kernels * 9.5e-6
    else:
        calls = {"blocks": n_layer, "blocks+head": n_layer + 1, "model": 1}[scope or "blocks"]
        calls += n_ck if (partial and scope != "model") else 0
        eager_head = 0 if head_compiled else k_head
        if graphs:
            t_cpu = calls * 2 * 28e-6 + eager_head * 9.5e-6 + k_opt * 9.5e-6
        else:
            t_cpu = (n_kernels - eager_head - k_opt) * 4.0e-6 + calls * 2 * 45e-6 + (eager_head + k_opt) * 9.5e-6
    t_cpu += 0.00035  # zero_grad, the optimizer's Python, the step's sync
    contention = 1.0 + 0.011 * workers * 16 / dev.cpu_count
    t_cpu *= dev.cpu * contention
    rate = (0.16e6 if padded else 0.26e6) / dev.cpu  # tokens/s one core tokenizes and batches
    load = 0.0
    if workers == 0:
        load = tokens / rate + 0.00015  # in the loop, after the step's sync: serial
        supply = 0.0
    else:
        t_cpu += (0.00015 + tokens * 8 / 6e9) * dev.cpu  # unpickling a worker's batch
        usable = min(workers, max(1, dev.cpu_count - 3))
        supply = tokens / (usable * rate * (0.92 if workers > 4 else 1.0))
    if dt == "float16":
        t_cpu += 0.0006 + 0.03 * t_cpu  # GradScaler's found_inf read: a sync the queue drains on
        t_gpu *= 1.026  # the scaler's unscale and inf checks, and float16's extra casts around reductions
    # Kernel selection: cuBLAS heuristics and inductor's choices differ per shape, dtype and
    # graph; one seeded factor per (budget, batching, dtype, mode, scope, backend), shared by
    # the knobs that do not change the kernels (workers, placement), one more for the head.
    shape_key = f"{tokens}|{cfg['batching']}|{dt}|{mode}|{scope}|{backend}"
    head_key = f"{tokens}|{dt}|{head_compiled}|{chunked}"
    t_gpu += t_head * (math.exp(_rng(land, head_key, "head").gauss(0.0, 0.05)) - 1.0)
    t_gpu *= math.exp(_rng(land, shape_key, "kernels").gauss(0.0, 0.015))
    step = _smooth_max(t_gpu, t_cpu) + 0.85 * load
    if supply:
        step = _smooth_max(step, supply, 6.0)
    step *= 1.0 + 0.0042 * workers * 16 / dev.cpu_count  # host jitter: workers share cores and memory bandwidth

    # --- memory -------------------------------------------------------------------------------
    static = 16 * n_all + (2 * n_mm if half else 0) + 0.26 * GB
    act_layer = (36 if half else 64) * d
    if compiled:
        act_layer *= 0.8
    if backend == "math":
        act_layer += n_head * tw * eb * (1.0 if compiled else 1.5)
    else:
        act_layer += n_head * 4
    act = tokens * ((n_layer - n_ck) * act_layer + n_ck * 4 * d)
    if head_compiled:
        logits = min(tokens, 2048) * VOCAB * 8 if chunked else tokens * VOCAB * 6.5
    else:
        logits = min(tokens, 2048) * VOCAB * 12 if chunked else tokens * VOCAB * 12
    logits += tokens * d * 4
    at_loss = act + logits
    if n_ck:  # a checkpointed block's recompute holds one block's activations on top of what is left
        one = tokens * act_layer
        if partial and ckpt == list(range(n_ck)):  # first: recomputed last, when little is left
            during = tokens * n_ck * 4 * d + one
        elif partial and ckpt != list(range(n_layer - n_ck, n_layer)):  # spread
            during = act * 0.96 + one
        else:  # last, or all: recomputed at once
            during = act + one
        peak_act = max(at_loss, during)
    else:
        peak_act = at_loss
    extra = 0.0
    if compiled:
        extra += 0.25 * GB
    if mode == "reduce-overhead":
        extra += 0.38 * act + 0.9 * GB  # CUDA graph trees' private pool
    elif mode == "max-autotune":
        extra += 0.2 * act + 1.1 * GB  # its graphs' pool, autotuning buffers
    if partial and scope == "model":
        extra += 0.12 * act
    if backend == "cudnn":
        extra += tokens * n_head * dev.cudnn_ws
    if backend == "efficient":
        extra += tokens * n_head * 8
    peak = static + peak_act + extra
    frag = 1.09 if padded else 1.025
    usable_bytes = dev.total_bytes - 0.55 * GB

    rng = _rng(land, key, "noise")
    setup = 3.2 + 2.4 * n_all / 1e9 + 0.35 * workers + rng.uniform(0.0, 1.2)
    compile_s = _compile_seconds(n_layer, d, cfg, mode, scope, partial, n_ck, padded, rng) if compiled else 0.0
    if peak * frag > usable_bytes:
        need = peak * frag / 2**30
        return {
            "outcome": "oom",
            "reason": f"CUDA out of memory: the step needs about {need:.1f} GiB of {dev.total_bytes / 2**30:.1f} GiB",
            "tokens_per_sec": None,
            "peak_memory_bytes": None,
            "step_time_cv": None,
            **_costs(setup + step, 0.6 * compile_s, 0.0),
        }

    # --- measurement --------------------------------------------------------------------------
    noisy = step * math.exp(rng.gauss(0.0, land.noise))
    tps = tokens * (1.0 - pad) / noisy
    cv = 0.005 + 0.012 * (workers == 0) + (0.055 if padded else 0.0) + 0.004 * (dt == "float16")
    cv += 0.025 * min(1.0, t_cpu / t_gpu) ** 4
    cv *= rng.uniform(0.7, 1.35)
    peak_measured = int(peak * rng.uniform(0.995, 1.005)) // 65536 * 65536
    steps = max(20, math.ceil(2.0 / noisy))
    timed = steps * noisy * (1 + cv * 0.5)
    warm = 3 * noisy
    return {
        "outcome": "ok",
        "reason": None,
        "tokens_per_sec": round(tps, 1),
        "peak_memory_bytes": peak_measured,
        "step_time_cv": round(cv, 4),
        **_costs(setup + warm + 0.8, compile_s, timed),
    }


def _compile_seconds(n_layer, d, cfg, mode, scope, partial, n_ck, padded, rng) -> float:
    width = 1.0 + d / 4000
    if mode == "max-autotune":
        base = {"blocks": 170.0, "blocks+head": 235.0, "model": 150.0 + 5.5 * n_layer}[scope]
        base *= 1.0 + d / 2500  # larger GEMMs: longer benchmarking
    else:
        scope = scope or "blocks"
        base = {"blocks": 34.0, "blocks+head": 47.0, "model": 26.0 + 2.3 * n_layer}[scope]
        base *= width
        if mode == "reduce-overhead":
            base += 6.0 + 0.25 * n_layer
    if partial:
        base *= 1.0 if scope == "model" else 1.55  # a second block graph
    elif n_ck:
        base *= 1.12
    if padded:
        base *= 1.35  # recompiles for dynamic widths
    if cfg["amp_dtype"] == "float16":
        base *= 1.03
    return base * rng.uniform(0.88, 1.14)


def _costs(process: float, compile_s: float, timed: float) -> dict[str, float]:
    process, compile_s, timed = round(process, 2), round(compile_s, 2), round(timed, 2)
    return {
        "process_s": process,
        "compile_s": compile_s,
        "timed_s": timed,
        "wall_s": round(process + compile_s + timed, 2),
    }


def _unsupported(reason: str) -> dict[str, Any]:
    return {
        "outcome": "unsupported",
        "reason": reason,
        "tokens_per_sec": None,
        "peak_memory_bytes": None,
        "step_time_cv": None,
        "process_s": 0.0,
        "compile_s": 0.0,
        "timed_s": 0.0,
        "wall_s": 0.0,
    }


def build(land: Landscape) -> dict[str, Any]:
    import yaml

    n_layer = MODELS[land.model][0]
    space = load_space(SPACE, n_layer=n_layer, seq_len=SEQ)
    raw = yaml.safe_load(SPACE.read_text(encoding="utf-8"))
    records = []
    for params, cfg in enumerate_space(space):
        config = cfg.to_dict()
        reason = space.violation(cfg)
        fields = _unsupported(reason) if reason is not None else simulate(land, config)
        records.append({"params": params, "config": config, "key": config_key(cfg), **fields})
    dev = land.device
    return {
        "format": "autotune.sweep",
        "version": 2,
        "created": "2026-12-01T00:00:00+00:00",
        "model": land.model,
        "device": {
            "kind": "cuda",
            "name": dev.name,
            "uuid": None,
            "index": 0,
            "total_memory_bytes": dev.total_bytes,
            "compute_capability": dev.cc,
            "driver": dev.driver,
            "cuda": dev.cuda,
            "torch": "2.13.0+cu126",
            "cpu_count": dev.cpu_count,
        },
        "machine": {
            "host": f"synthetic-{land.name}",
            "cpu": "x86_64",
            "cores": dev.cpu_count,
            "torch": "2.13.0+cu126",
            "python": "3.11.7",
        },
        "run": {"steps": 20, "warmup": 3, "min_time_s": 2.0},
        "space": raw,
        "space_source": "benchmarks/holdout/space.yaml",
        "n_layer": n_layer,
        "seq_len": SEQ,
        "complete": True,
        "synthetic": True,
        "landscape": {
            "name": land.name,
            "about": land.about,
            "seed": land.seed,
            "generator": "benchmarks/holdout/generate.py",
        },
        "configurations": records,
    }


def write(land: Landscape, data: dict[str, Any]) -> Path:
    path = HERE / f"{land.name}.json.gz"
    payload = json.dumps(data, separators=(",", ":")).encode("utf-8")
    with open(path, "wb") as fh:  # mtime 0: the same bytes on every run
        with gzip.GzipFile(filename="", mode="wb", fileobj=fh, compresslevel=9, mtime=0) as gz:
            gz.write(payload)
    return path


QUANTILES = (0.3, 0.5, 0.7, 0.9)


def summary(data: dict[str, Any], path: str) -> list[str]:
    from _replay import TOLERANCE, Sweep, measured, memory_limit

    sweep = Sweep.from_dict(data, path)
    recs = sweep.records
    counts: dict[str, int] = {}
    for r in recs:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    lines = [f"{path}: {len(recs)} configurations {counts}"]
    for q in QUANTILES:
        limit = memory_limit(recs, q)
        feasible = [r for r in recs if measured(r) and r["peak_memory_bytes"] <= limit]
        best = max(feasible, key=lambda r: r["tokens_per_sec"])
        near = sum(r["tokens_per_sec"] >= (1 - TOLERANCE) * best["tokens_per_sec"] for r in feasible)
        lines.append(
            f"  q={q}: limit {limit / 2**30:.2f} GiB, best {best['tokens_per_sec']:.0f} tok/s, "
            f"{near} within 3 %: {best['params']}"
        )
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", action="append", help="landscape name (repeatable)")
    p.add_argument("--check", action="store_true", help="summarise the written files, write nothing")
    args = p.parse_args()
    chosen = [land for land in LANDSCAPES if not args.only or land.name in args.only]
    for land in chosen:
        path = HERE / f"{land.name}.json.gz"
        if args.check:
            with gzip.open(path, "rt", encoding="utf-8") as fh:
                data = json.load(fh)
        else:
            data = build(land)
            write(land, data)
        size = path.stat().st_size / 2**20 if path.exists() else 0.0
        for line in summary(data, str(path)):
            print(line)
        print(f"  file {size:.2f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
