"""Applying the model-side knobs: activation checkpointing, torch.compile, AMP and TF32,
the forced SDPA backend, the gradient scaler, and the rules for what a device can run.

Works on any model whose transformer blocks sit in one `nn.ModuleList` (ours, Hugging
Face's, Llama-style code). The order of wraps is fixed, for a reason:

    1. checkpointing   (wraps each chosen block's forward in non-reentrant checkpointing)
    2. compile         (per block, so the checkpointed region is traced inside the block)

Compiling after checkpointing lets dynamo see the checkpoint as one higher-order op and
plan the recomputation itself; the other order would hide the compiled code inside an
eager recomputation. We compile per block rather than the whole model because the blocks
are identical: one graph is traced and reused by every block, so compile time does not grow
with depth (it is paid in every trial), and the embedding, head and loss stay in eager
where a variable sequence length costs nothing.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from autotune.config import TrainConfig
from autotune.errors import UnsupportedConfig, UsageError

# Where blocks live in common codebases, tried in this order.
BLOCK_PATHS = ("transformer.h", "model.layers", "layers", "blocks", "transformer.layers",
               "gpt_neox.layers", "model.decoder.layers", "h")

_CHECKPOINT_MARK = "__autotune_checkpointed__"


def find_blocks(model: nn.Module, block_path: str | None = None) -> nn.ModuleList:
    """The `nn.ModuleList` of transformer blocks, at `block_path` or a common location."""
    paths = (block_path,) if block_path else BLOCK_PATHS
    for path in paths:
        found = _get_path(model, path)
        if isinstance(found, nn.ModuleList) and len(found) > 0:
            return found
        if block_path:
            kind = type(found).__name__ if found is not None else "nothing"
            raise UsageError(f"block_path {block_path!r} names {kind}, expected a non-empty torch.nn.ModuleList")
    raise UsageError(
        f"cannot find the transformer blocks of {type(model).__name__}: looked for a ModuleList at "
        f"{', '.join(BLOCK_PATHS)}; name it with block_path='...'"
    )


def _get_path(root: nn.Module, path: str) -> object | None:
    node: object = root
    for part in path.split("."):
        node = getattr(node, part, None)
        if node is None:
            return None
    return node


def check_block_indices(layers: tuple[int, ...], n_blocks: int) -> None:
    beyond = [i for i in layers if i >= n_blocks]
    if beyond:
        raise UsageError(
            f"checkpoint_layers {list(layers)}: block {beyond[0]} does not exist, the model has "
            f"{n_blocks} blocks (0..{n_blocks - 1})"
        )


def apply_activation_checkpointing(model: nn.Module, layers: tuple[int, ...], block_path: str | None = None,
                                   *, will_compile: bool = False) -> nn.Module:
    """Recompute the chosen blocks' activations in backward instead of storing them.

    The block's `forward` is replaced on the instance, not wrapped in a new module, so the
    model's state_dict keys do not change and a user's checkpoint still loads."""
    if not layers:
        return model
    blocks = find_blocks(model, block_path)
    check_block_indices(layers, len(blocks))
    for index in layers:
        block = blocks[index]
        if not is_checkpointed(block):
            block.forward = _checkpointed(block.forward, keep_sdpa_choice=not will_compile)
    return model


def _checkpointed(forward: Callable[..., torch.Tensor], keep_sdpa_choice: bool) -> Callable[..., torch.Tensor]:
    @functools.wraps(forward)
    def run(*args, **kwargs):
        # Non-reentrant: works with kwargs, inputs that need no grad, and torch.compile.
        # The recomputation runs in backward, usually outside the forced-SDPA context; in
        # eager it must pick the same attention kernel as the forward did, or the recomputed
        # tensors differ and checkpoint raises. Compiled blocks bake the kernel into the graph.
        if keep_sdpa_choice:
            flags = _sdpa_flags()
            return checkpoint(forward, *args, use_reentrant=False,
                              context_fn=lambda: (contextlib.nullcontext(), _sdpa_flags_set(flags)), **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    setattr(run, _CHECKPOINT_MARK, True)
    return run


_SDP_FLAGS = ("flash_sdp", "mem_efficient_sdp", "math_sdp", "cudnn_sdp")


def _sdpa_flags() -> tuple[bool, ...]:
    """Which SDPA backends are enabled now (sdpa_kernel sets these process-wide flags)."""
    return tuple(getattr(torch.backends.cuda, f"{name}_enabled")() for name in _SDP_FLAGS)


@contextlib.contextmanager
def _sdpa_flags_set(flags: tuple[bool, ...]) -> Iterator[None]:
    saved = _sdpa_flags()
    for name, on in zip(_SDP_FLAGS, flags):
        getattr(torch.backends.cuda, f"enable_{name}")(on)
    try:
        yield
    finally:
        for name, on in zip(_SDP_FLAGS, saved):
            getattr(torch.backends.cuda, f"enable_{name}")(on)


def is_checkpointed(block: nn.Module) -> bool:
    return getattr(block.__dict__.get("forward"), _CHECKPOINT_MARK, False)


def apply_compile(model: nn.Module, mode: str, block_path: str | None = None) -> nn.Module:
    """Compile each block in place (`nn.Module.compile`, so state_dict keys are unchanged)."""
    if mode == "none":
        return model
    for block in find_blocks(model, block_path):
        block.compile(mode=mode)
    return model


def is_compiled(block: nn.Module) -> bool:
    return getattr(block, "_compiled_call_impl", None) is not None


def apply_model_knobs(model: nn.Module, cfg: TrainConfig, block_path: str | None = None) -> nn.Module:
    """Checkpointing, then compile: the one documented order."""
    apply_activation_checkpointing(model, cfg.checkpoint_layers, block_path, will_compile=cfg.compile_mode != "none")
    return apply_compile(model, cfg.compile_mode, block_path)


_SDPA_BACKENDS = {
    "math": "MATH",
    "efficient": "EFFICIENT_ATTENTION",
    "flash": "FLASH_ATTENTION",
    "cudnn": "CUDNN_ATTENTION",
}

_AUTOCAST_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


@contextlib.contextmanager
def precision(device_kind: str, amp_dtype: str) -> Iterator[None]:
    """AMP autocast for float16/bfloat16, TF32 matmuls for tf32, nothing for float32.
    TF32 is process-wide state in torch, so it is set here and restored on exit."""
    if amp_dtype == "tf32":
        saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        try:
            yield
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
        return
    dtype = _AUTOCAST_DTYPES.get(amp_dtype)
    with torch.autocast(device_type=device_kind, dtype=dtype, enabled=dtype is not None):
        yield


def sdpa_backend(backend: str) -> contextlib.AbstractContextManager[None]:
    """Force one SDPA backend: an unsupported input then raises instead of silently
    falling back to another kernel, which would make the trial measure the wrong thing."""
    if backend == "auto":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([getattr(SDPBackend, _SDPA_BACKENDS[backend])])


@contextlib.contextmanager
def training_context(device_kind: str, cfg: TrainConfig) -> Iterator[None]:
    """Everything a forward pass runs under: AMP dtype (or TF32) and the forced SDPA backend."""
    with precision(device_kind, cfg.amp_dtype), sdpa_backend(cfg.sdpa_backend):
        yield


def grad_scaler(device_kind: str, amp_dtype: str) -> torch.amp.GradScaler:
    """Loss scaling guards float16's narrow exponent; bfloat16 and float32 need none, and a
    disabled scaler is a no-op, so the training step has no branch."""
    return torch.amp.GradScaler(device_kind, enabled=amp_dtype == "float16")


def is_sdpa_unsupported_error(exc: BaseException) -> bool:
    """The errors torch raises when a forced SDPA backend cannot run these inputs."""
    text = str(exc)
    return isinstance(exc, RuntimeError) and (
        "No viable backend for scaled_dot_product_attention" in text or "No available kernel" in text
    )


@dataclass(frozen=True)
class DeviceCapabilities:
    """What the support rules need to know of a device, readable without initializing CUDA."""

    kind: str  # "cpu" or "cuda"
    compute_capability: tuple[int, int] | None = None  # CUDA only, e.g. (9, 0)
    has_triton: bool = True  # torch.compile's CUDA backend

    @classmethod
    def detect(cls, kind: str, compute_capability: tuple[int, int] | None) -> "DeviceCapabilities":
        return cls(kind, compute_capability, importlib.util.find_spec("triton") is not None)


def check_supported(cfg: TrainConfig, caps: DeviceCapabilities) -> None:
    """Reject, before anything runs, what this device cannot run; the reason names the knob.
    Rules that can only be known by trying (a kernel for an exotic shape) surface at run time
    through `is_sdpa_unsupported_error`."""
    if caps.kind == "cpu":
        _check_cpu(cfg)
    else:
        _check_cuda(cfg, caps)


def _check_cpu(cfg: TrainConfig) -> None:
    if cfg.pin_memory:
        raise UnsupportedConfig("pin_memory", "pinned memory only speeds host-to-GPU copies; there is no GPU")
    if cfg.amp_dtype == "tf32":
        raise UnsupportedConfig("amp_dtype", "tf32 is a CUDA tensor-core format; CPUs have none")
    if cfg.sdpa_backend in ("efficient", "cudnn"):
        raise UnsupportedConfig("sdpa_backend", f"{cfg.sdpa_backend} attention is a CUDA kernel; on CPU use math or flash")
    if cfg.compile_mode == "reduce-overhead":
        raise UnsupportedConfig("compile_mode", "reduce-overhead means CUDA graphs, which need a CUDA device")


def _check_cuda(cfg: TrainConfig, caps: DeviceCapabilities) -> None:
    major = caps.compute_capability[0] if caps.compute_capability else 0
    if cfg.amp_dtype in ("bfloat16", "tf32") and major < 8:
        raise UnsupportedConfig("amp_dtype", f"{cfg.amp_dtype} needs compute capability 8.0 or newer (Ampere)")
    if cfg.sdpa_backend in ("flash", "cudnn"):
        if cfg.amp_dtype not in ("float16", "bfloat16"):
            raise UnsupportedConfig("sdpa_backend", f"{cfg.sdpa_backend} attention needs float16 or bfloat16, not {cfg.amp_dtype}")
        if major < 8:
            raise UnsupportedConfig("sdpa_backend", f"{cfg.sdpa_backend} attention needs compute capability 8.0 or newer")
    if cfg.compile_mode != "none" and not caps.has_triton:
        raise UnsupportedConfig("compile_mode", "torch.compile on CUDA needs triton, which is not installed")
