"""`autotune profile`: where a recipe's training step spends its time.

Runs a configuration with the measuring core's own training step (`step.make_train_step`,
optimizer and data pipeline included) under `torch.profiler`, then attributes time:

    data wait     host time blocked on the next batch (the `autotune:data_wait` region)
    attention     SDPA ops (flash / efficient / cuDNN / CPU flash kernels, forward and backward)
    matmuls       mm, addmm, bmm, linear, matmul (and their backward nodes)
    elementwise   layer norm, GELU, add, mul, softmax, dropout, copies, the loss; and the
                  fused kernels torch.compile generates (mostly fused elementwise/norm code;
                  its matmuls stay separate aten::mm calls)
    optimizer     everything inside the `autotune:optimizer` region (AdamW, grad-scaler
                  update, zero_grad), and adam / _foreach ops anywhere
    other         everything else: embeddings, views, Python overhead, an idle device

Each op's *self* time is counted once, in the category of its nearest enclosing region or
SDPA op, else by its own name. On CUDA the time is self device (kernel) time, and data wait
is host time, which may overlap queued GPU work; on CPU every figure is self CPU time on the
training thread. Shares are of the wall time of the profiled steps; `other` is the rest.

The Chrome trace (`trace.json`) opens in Perfetto (ui.perfetto.dev) and chrome://tracing.
"""

from __future__ import annotations

import re
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

import torch
import torch.nn as nn
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from autotune.config import IGNORE_INDEX, TrainConfig, check_int
from autotune.data.batching import build_dataloader
from autotune.data.datasets import make_dataset
from autotune.device import describe, resolve_device
from autotune.errors import UsageError
from autotune.knobs.apply import apply_model_knobs
from autotune.knobs.precision import grad_scaler
from autotune.knobs.support import DeviceCapabilities, check_supported
from autotune.measure.loop import MAX_SHAPE_WARMUP
from autotune.measure.step import OPTIMIZER_REGION, endless_batches, make_optimizer, make_train_step
from autotune.model.introspect import model_shape
from autotune.model.load import build_model

DATA_REGION = "autotune:data_wait"
CATEGORIES = ("data_wait", "attention", "matmul", "elementwise", "optimizer", "other")
CATEGORY_LABELS = {
    "data_wait": "data wait",
    "attention": "attention (SDPA)",
    "matmul": "matmuls",
    "elementwise": "elementwise / norm",
    "optimizer": "optimizer",
    "other": "other",
}
TRACE_NAME = "trace.json"


@dataclass
class OpTime:
    name: str
    category: str
    self_time_s: float  # over all profiled steps
    calls: int
    share: float  # of the profiled wall time


@dataclass
class ProfileReport:
    model: str
    device: str
    device_name: str
    config: dict[str, Any]
    steps: int
    warmup_steps: int
    wall_s: float  # the profiled steps, synchronized
    time_basis: str  # "self CPU time" or "self device time"
    seconds: dict[str, float]  # per category, over all profiled steps
    shares: dict[str, float]  # per category, of wall_s; they add up to 1
    top_ops: list[OpTime] = field(default_factory=list)
    tokens: int = 0  # non-pad target tokens in the profiled steps
    trace_path: str = ""

    @property
    def step_time_s(self) -> float:
        return self.wall_s / self.steps

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["step_time_s"] = self.step_time_s
        return data


def profile_config(
    cfg: TrainConfig,
    *,
    model_name: str | None,
    seq_len: int | None = None,
    device: str = "auto",
    steps: int = 10,
    out_dir: str | Path,
    model: nn.Module | None = None,
    data: str = "synthetic",
    warmup: int = 2,
    seed: int = 0,
    top: int = 15,
) -> ProfileReport:
    """Profile `steps` training steps of `cfg` (after `warmup` unprofiled ones, where
    compilation happens) on `device`, with the model named `model_name` or the given `model`
    (its blocks at a standard location; see `model.introspect.find_blocks`). Writes
    out_dir/trace.json. Raises UnsupportedConfig when this device cannot run `cfg`."""
    check_int("steps", steps, minimum=1)
    check_int("warmup", warmup, minimum=0)
    device = resolve_device(device)
    info = describe(device)
    check_supported(cfg, DeviceCapabilities.detect(info.kind, info.capability_tuple))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    if info.kind == "cuda":
        torch.cuda.set_device(torch.device(device))

    if model is None:
        if not model_name:
            raise UsageError("the recipe names no model (model.name); pass one")
        model = build_model(str(model_name))
    _check_seq_len(seq_len, model)
    shape = model_shape(model, seq_len)
    target = torch.device(device)
    model.to(target).train()
    apply_model_knobs(model, cfg)
    optimizer = make_optimizer(model, target)
    step = make_train_step(
        model,
        optimizer,
        grad_scaler(info.kind, cfg.amp_dtype),
        device=target,
        device_kind=info.kind,
        cfg=cfg,
        annotate=True,
    )
    dataset = make_dataset(data, vocab_size=shape.vocab_size, seq_len=shape.context_length, seed=seed)
    batches = endless_batches(build_dataloader(dataset, cfg, seq_len=shape.context_length, seed=seed))
    sync = (lambda: torch.cuda.synchronize(target)) if info.kind == "cuda" else (lambda: None)

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if info.kind == "cuda" else [])
    tokens = 0
    try:
        warmed = _warm_up(batches, step, warmup, need_shapes=cfg.compile_mode != "none" and cfg.batching == "padded")
        sync()
        with profile(activities=activities, record_shapes=False) as prof:
            start = time.perf_counter()
            for _ in range(steps):
                with record_function(DATA_REGION):
                    x, y, *documents = next(batches)  # packed documents add document_ids
                tokens += int((y != IGNORE_INDEX).sum())
                step(x, y, *documents)
            sync()
            wall = time.perf_counter() - start
    finally:
        batches.close()  # DataLoader workers go now, not at garbage collection
    trace = out / TRACE_NAME
    prof.export_chrome_trace(str(trace))
    seconds, ops = attribute(prof.events(), device_time=info.kind == "cuda")
    shares, seconds = _shares(seconds, wall)
    total = max(wall, sum(seconds.values()))
    top_ops = [
        OpTime(op, cat, t, calls, t / total)
        for (op, cat), (t, calls) in sorted(ops.items(), key=lambda kv: -kv[1][0])[:top]
    ]
    return ProfileReport(
        model=str(model_name or type(model).__name__),
        device=device,
        device_name=info.name,
        config=cfg.to_dict(),
        steps=steps,
        warmup_steps=warmed,
        wall_s=wall,
        time_basis="self device time" if info.kind == "cuda" else "self CPU time",
        seconds=seconds,
        shares=shares,
        top_ops=top_ops,
        tokens=tokens,
        trace_path=str(trace),
    )


def _check_seq_len(seq_len: int | None, model: nn.Module) -> None:
    context = getattr(model, "context_length", None)
    if isinstance(seq_len, int) and isinstance(context, int) and seq_len > context:
        raise UsageError(f"the recipe's seq_len {seq_len} is longer than the model's context {context}")


def _warm_up(batches, step, warmup: int, *, need_shapes: bool) -> int:
    """As measure does: with compile and padded batches, go on until two widths were seen,
    so dynamo marks the length dynamic and recompiles before, not inside, the profile."""
    widths: set[int] = set()
    done = 0
    while done < warmup or (need_shapes and len(widths) < 2 and done < warmup + MAX_SHAPE_WARMUP):
        x, y, *documents = next(batches)  # packed documents add document_ids
        widths.add(x.shape[1])
        step(x, y, *documents)
        done += 1
    return done


# ------------------------------------------------------------------------ attribution


def attribute(events: Iterable[Any], *, device_time: bool) -> tuple[dict[str, float], dict[tuple[str, str], list]]:
    """Seconds per category, and per (op name, category) [seconds, calls], from the
    profiler's FunctionEvents. Only host-side events are read: a kernel's time is the
    self device time of the op that launched it, so it is counted once."""
    seconds = dict.fromkeys(CATEGORIES, 0.0)
    ops: dict[tuple[str, str], list] = defaultdict(lambda: [0.0, 0])
    for ev in events:
        if ev.device_type != DeviceType.CPU or getattr(ev, "is_async", False):
            continue
        category = category_of(ev)
        if device_time:
            if category == "data_wait":
                # Host time blocked on data, taken whole from the region (its children
                # included), since waiting launches no kernel to measure it by.
                if ev.name != DATA_REGION:
                    continue
                t = ev.cpu_time_total
            else:
                t = ev.self_device_time_total
        else:
            t = ev.self_cpu_time_total
        t /= 1e6  # the profiler counts microseconds
        seconds[category] += t
        if not ev.name.startswith("autotune:"):  # our regions are the breakdown, not ops
            # By name and category: a copy_ in the optimizer and one in the forward are
            # different costs.
            entry = ops[ev.name, category]
            entry[0] += t
            entry[1] += 1
    return seconds, dict(ops)


def _shares(seconds: dict[str, float], wall: float) -> tuple[dict[str, float], dict[str, float]]:
    """Shares of the wall time; `other` also takes what no op accounts for. If the parts
    add up to more than the wall (host waits overlapping device work), they are scaled to
    add up to 1."""
    named = {c: s for c, s in seconds.items() if c != "other"}
    seconds = {**seconds, "other": max(seconds["other"], wall - sum(named.values()))}
    total = max(wall, sum(seconds.values()))
    return {c: (s / total if total > 0 else 0.0) for c, s in seconds.items()}, seconds


def category_of(ev: Any) -> str:
    """The nearest enclosing region or SDPA op decides; else the op's own name."""
    node = ev
    while node is not None:
        if node.name == DATA_REGION:
            return "data_wait"
        if node.name == OPTIMIZER_REGION:
            return "optimizer"
        if is_attention(node.name):
            return "attention"
        node = node.cpu_parent
    return classify_op(ev.name)


_ATTENTION_MARKS = ("scaleddotproduct", "flashattention", "efficientattention", "cudnnattention", "flashattn", "sdpa")
_MATMULS = {
    "mm",
    "addmm",
    "bmm",
    "baddbmm",
    "linear",
    "matmul",
    "addmv",
    "mv",
    "dot",
    "addmmactivation",
    "einsum",
    "mkldnnlinear",
    "mkllinear",
    "scaledmm",
    "intmm",
}
_ELEMENTWISE = {
    "layernorm",
    "nativelayernorm",
    "rmsnorm",
    "fusedrmsnorm",
    "groupnorm",
    "nativegroupnorm",
    "batchnorm",
    "nativebatchnorm",
    "gelu",
    "softmax",
    "logsoftmax",
    "dropout",
    "nativedropout",
    "copy",
    "tocopy",
    "to",
    "add",
    "mul",
    "div",
    "sub",
    "rsub",
    "fill",
    "zero",
    "neg",
    "exp",
    "where",
    "clone",
    "contiguous",
    "nllloss",
    "nlllossnd",
    "nllloss2d",
    "crossentropyloss",
    "crossentropy",
    "sum",
    "mean",
    "pow",
    "sqrt",
    "rsqrt",
    "tanh",
    "relu",
    "silu",
    "sigmoid",
    "maskedfill",
    "threshold",
    "addcmul",
    "addcdiv",
    "lerp",
    "mse",
    "mseloss",
}
_COMPILED_MARKS = ("triton", "cppfused", "compiledfunction", "torchcompiledregion", "compiledfxgraph")


def _squash(name: str) -> str:
    """The op's name alone, lower case, no underscores, no backward/forward suffix:
    "autograd::engine::evaluate_function: AddmmBackward0" -> "addmm",
    "aten::native_layer_norm_backward" -> "nativelayernorm"."""
    text = name.rsplit(": ", 1)[-1]
    text = text.split("::")[-1].lower().replace("_", "")
    for suffix in ("backward0", "backward1", "backwarddata", "backward", "forward", "forcpu"):
        text = text.removesuffix(suffix)
    return text


def _flat(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def is_attention(name: str) -> bool:
    flat = _flat(name)
    return any(mark in flat for mark in _ATTENTION_MARKS)


def classify_op(name: str) -> str:
    """A category by the op's own name (regions and SDPA ancestors are `category_of`'s)."""
    lowered, flat = name.lower(), _flat(name)
    if "adam" in flat or "foreach" in flat or lowered.startswith("optimizer."):
        return "optimizer"
    if is_attention(name):
        return "attention"
    base = _squash(name)
    if base in _MATMULS:
        return "matmul"
    if any(mark in flat for mark in _COMPILED_MARKS):
        # Inductor's kernels: templates ("triton_tem_fused_mm") are matmuls, the rest fused
        # pointwise/reduction code (norms, activations, residual adds).
        return "matmul" if "_tem_" in lowered else "elementwise"
    if base in _ELEMENTWISE or "norm" in base:
        return "elementwise"
    return "other"
