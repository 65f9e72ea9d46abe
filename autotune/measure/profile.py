"""`autotune profile`: where a recipe's training step spends its time.

Runs a configuration with the measuring core's own training step (`step.make_train_step`,
optimizer and data pipeline included) under `torch.profiler`, then attributes time:

    data wait     host time blocked on the next batch (the `autotune:data_wait` region)
    attention     SDPA ops (flash / efficient / cuDNN / CPU flash kernels, forward and backward)
    matmuls       mm, addmm, bmm, linear, matmul (and their backward nodes)
    elementwise   layer norm, GELU, add, mul, softmax, dropout, copies, the loss
    optimizer     everything inside the `autotune:optimizer` region (AdamW, grad-scaler
                  update, zero_grad), and adam / _foreach ops anywhere
    compiled      time inside a torch.compile graph that no kernel event accounts for: said
                  plainly, never guessed (the graph's own overhead, or its kernels when the
                  profile has no per-kernel events)
    other         everything else: embeddings, views, Python overhead, an idle device

Compiled code is attributed to the operations it fuses. Inductor names each kernel after the
aten ops it fuses (`triton_per_fused__safe_softmax_...`, `cpp_fused_native_layer_norm_...`);
a kernel is attention when it holds the softmax or causal mask of attention, a matmul when it
is a matmul template, else elementwise / norm. Matmuls a compiled graph leaves to extern
kernels stay aten::mm / addmm (the projections and the MLP) and aten::bmm, which inside a
compiled block is attention's (QK^T and PV: the block's other matmuls are 2-D). On CPU the
generated C++ kernels get events only with inductor's `cpp.enable_kernel_profile`, which
`profile_config` turns on; Triton kernels always have them.

Each op's *self* time is counted once, in the category of its nearest enclosing region or
SDPA op, else by its own name. On CUDA the time is self device (kernel) time, and data wait
is host time, which may overlap queued GPU work; on CPU every figure is self CPU time on the
training thread. Shares are of the wall time of the profiled steps; `other` is the rest.

The Chrome trace (`trace.json`) opens in Perfetto (ui.perfetto.dev) and chrome://tracing.
"""

from __future__ import annotations

import contextlib
import gc
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

from autotune.config import IGNORE_INDEX, RunSpec, TrainConfig, check_int
from autotune.device import describe, resolve_device
from autotune.device.disk import check_output_folder
from autotune.errors import UsageError
from autotune.knobs.precision import fp32_precision
from autotune.knobs.support import DeviceCapabilities, check_supported
from autotune.measure.compile_events import CompileEvents
from autotune.measure.cuda import session_for
from autotune.measure.setup import set_up_training
from autotune.measure.step import OPTIMIZER_REGION

DATA_REGION = "autotune:data_wait"
CATEGORIES = ("data_wait", "attention", "matmul", "elementwise", "optimizer", "compiled", "other")
CATEGORY_LABELS = {
    "data_wait": "data wait",
    "attention": "attention (SDPA)",
    "matmul": "matmuls",
    "elementwise": "elementwise / norm",
    "optimizer": "optimizer",
    "compiled": "compiled, not split",
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
    # Compiles or CUDA graph recordings inside the profiled steps (a shape the warm-up did not
    # see): their time is in `compiled`, and the breakdown is not the steady state's.
    compiles_in_window: int = 0
    accumulation_steps: int = 1  # micro-steps per optimizer step (the recipe's global batch)
    optimizer_steps: int = 0  # in the profiled steps

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
    global_batch_tokens: int | None = None,
) -> ProfileReport:
    """Profile `steps` training steps of `cfg` (after `warmup` unprofiled ones, where
    compilation happens) on `device`, with the model named `model_name` or the given `model`
    (its blocks at a standard location; see `model.introspect.find_blocks`). The set-up is the
    measuring loop's (`measure.setup`): with `global_batch_tokens`, a step is a micro-step and
    the optimizer steps once per global batch, as in the run measured; the profiled steps are
    then whole optimizer steps. Writes out_dir/trace.json. Raises UnsupportedConfig when this
    device cannot run `cfg`."""
    check_int("steps", steps, minimum=1)
    check_int("warmup", warmup, minimum=0)
    device = resolve_device(device)
    info = describe(device)
    check_supported(cfg, DeviceCapabilities.detect(info.kind, info.capability_tuple))
    if model is None and not model_name:
        raise UsageError("the recipe names no model (model.name); pass one")
    spec = RunSpec(
        model=str(model_name or "a given model"),
        device=device,
        data=data,
        seq_len=seq_len,
        warmup=warmup,
        seed=seed,
        global_batch_tokens=global_batch_tokens,
    )
    out = check_output_folder(out_dir, (TRACE_NAME,), what="--out")
    out.mkdir(parents=True, exist_ok=True)
    with fp32_precision(cfg.amp_dtype), CompileEvents() as events:
        torch.manual_seed(seed)
        session = session_for(device, info, None)
        session.start()  # cuda:N set as the current device, with its index (see measure.cuda)
        run = set_up_training(
            spec,
            cfg,
            device=session.device,
            device_kind=info.kind,
            model=model,
            annotate=True,
            before_knobs=name_compiled_kernels if cfg.compile_mode != "none" else None,
        )
        steps = -(-steps // run.accumulation) * run.accumulation  # whole optimizer steps
        # Device time where this torch build can trace the GPU (kineto with CUPTI); a build
        # without it would trace nothing on the device, and asking for it anyway is very slow.
        device_time = info.kind == "cuda" and ProfilerActivity.CUDA in torch.profiler.supported_activities()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device_time else [])
        tokens = 0
        try:
            # As measure does: every shape first, so compiles, recompiles and CUDA graph
            # recordings happen before, not inside, the profile.
            warm = run.warm_up(spec, sync=session.sync, events=events)
            session.sync()
            compiles_before, optimizer_steps_before = events.total, run.step.optimizer_steps
            with no_garbage_collection(), profile(activities=activities, record_shapes=False) as prof:
                start = time.perf_counter()
                for _ in range(steps):
                    with record_function(DATA_REGION):
                        x, y, *documents = next(run.batches)  # packed documents add document_ids
                    tokens += int((y != IGNORE_INDEX).sum())
                    run.step(x, y, *documents)
                session.sync()
                wall = time.perf_counter() - start
            compiles_in_window = events.total - compiles_before
            optimizer_steps = run.step.optimizer_steps - optimizer_steps_before
        finally:
            run.close()  # DataLoader workers go now, not at garbage collection
    trace = out / TRACE_NAME
    prof.export_chrome_trace(str(trace))
    seconds, ops = attribute(prof.events(), device_time=device_time)
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
        warmup_steps=warm.shape_steps + len(warm.data_steps),
        wall_s=wall,
        time_basis="self device time" if device_time else "self CPU time",
        seconds=seconds,
        shares=shares,
        top_ops=top_ops,
        tokens=tokens,
        trace_path=str(trace),
        compiles_in_window=compiles_in_window,
        accumulation_steps=run.accumulation,
        optimizer_steps=optimizer_steps,
    )


@contextlib.contextmanager
def no_garbage_collection():
    """No garbage collection inside the block (as `timeit` does). A collection stalls
    whichever op is running for as long as it takes, seconds on the heap of a long-lived
    process, and over a few profiled steps one such stall would be most of the breakdown.
    Nothing is collected first: that too would cost the caller seconds on such a heap."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def name_compiled_kernels() -> None:
    """Give inductor's generated C++ kernels profiler events of their own, named after the ops
    they fuse (Triton kernels always have them), so `attribute` can split compiled time. Set
    before anything compiles; it is part of inductor's cache key, so a cached graph without
    the events is not reused."""
    try:
        import torch._inductor.config as inductor_config
    except ImportError:  # a torch without inductor compiles nothing
        return
    inductor_config.cpp.enable_kernel_profile = True


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
    """The nearest enclosing region or SDPA op decides; else the op's own name (a batched
    matmul inside a compiled graph is attention's: see the module docstring)."""
    node = ev
    compiled = False
    while node is not None:
        if node.name == DATA_REGION:
            return "data_wait"
        if node.name == OPTIMIZER_REGION:
            return "optimizer"
        if is_attention(node.name):
            return "attention"
        compiled = compiled or (node is not ev and is_compiled_region(node.name))
        node = node.cpu_parent
    if compiled and _squash(ev.name) in _BATCHED_MATMULS:
        return "attention"
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
_BATCHED_MATMULS = {"bmm", "baddbmm"}
# Events of a compiled graph as a whole (its wrapper, its autograd node, dynamo's region).
_COMPILED_REGIONS = ("compiledfxgraph", "compiledfunction", "torchcompiledregion")
# Inductor's generated kernels: "triton_poi_fused_add_0", "graph_1_cpp_fused_gelu_view_5", ...
_FUSED_KERNEL = re.compile(r"(?:^|_)(?:triton_(?:poi|per|red|tem|for|mix)|cpp)_fused_|^triton_")
# In a fused kernel's name: attention's softmax (not the loss's log_softmax) or causal mask.
_ATTENTION_FUSED = re.compile(r"(?<!log)_(?:safe_)?softmax|_tril|scaled_dot_product|flash|efficient_attention")
_LOSS_FUSED = ("log_softmax", "nll_loss", "cross_entropy")


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


def is_compiled_region(name: str) -> bool:
    flat = _flat(name)
    return any(mark in flat for mark in _COMPILED_REGIONS)


def fused_kernel_category(name: str) -> str | None:
    """The category of an inductor kernel by the aten ops its name says it fuses; None for
    anything else. Templates ("triton_tem_fused_mm_1") are matmuls; attention's softmax or
    causal mask makes a kernel attention's; the rest (norms, activations, residual adds, the
    loss) is elementwise / norm."""
    lowered = name.lower()
    if not _FUSED_KERNEL.search(lowered):
        return None
    if "_tem_" in lowered or re.search(r"fused_(?:b|add)?mm(?:_|$)", lowered):
        return "matmul"
    if not any(mark in lowered for mark in _LOSS_FUSED) and _ATTENTION_FUSED.search(lowered):
        return "attention"
    return "elementwise"


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
    if is_compiled_region(name):
        return "compiled"
    fused = fused_kernel_category(name)
    if fused is not None:
        return fused
    base = _squash(name)
    if base in _MATMULS:
        return "matmul"
    if base in _ELEMENTWISE or "norm" in base:
        return "elementwise"
    return "other"
