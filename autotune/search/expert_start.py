"""Expert start: besides the baseline and the checklist, a new study first runs the
configuration an expert would try first on this device class, so that TPE's model starts
near the good region instead of spending its random start-up trials on configurations that
are cheap to rule out.

    CUDA    bf16 autocast (fp16 before Ampere), flash attention, torch.compile (default mode,
            blocks and head), packed batches of the largest token budget likely to fit the
            memory limit, 4 pinned DataLoader workers, no checkpointing
    CPU     what the CPU sweep found (benchmarks/data/cpu_gpt2_tiny_sweep.json): float32,
            flash attention, a 4096-token budget, eager, no workers, no checkpointing

Each value is clipped to the space (the nearest choice the space offers, in a stated order of
preference), then checked against the space's rules and this device, as every proposal is.
The configurations are enqueued once, by the process that creates the study (with the
reference trials, `study._set_up`), and marked with the user attr `expert_start`. Pure and
torch-free: the sweep replay (benchmarks/) calls `expert_configs` too."""

from __future__ import annotations

import logging
import warnings
from typing import Any, Mapping, Sequence

import optuna
from optuna.trial import FixedTrial

from autotune.config import TrainConfig
from autotune.device.info import DeviceInfo
from autotune.errors import UnsupportedConfig, UsageError
from autotune.knobs.support import DeviceCapabilities, check_supported
from autotune.model.sizes import ModelDims
from autotune.space.definition import SearchSpace, matches
from autotune.space.sampling import params_for, suggest

log = logging.getLogger(__name__)

EXPERT_ATTR = "expert_start"  # the user attr that marks an expert-start trial: its label

# Each knob's values, most wanted first; the first the space offers is taken. A knob not listed
# keeps the space's first choice (or TrainConfig's default where the space does not search it).
CUDA_PREFERENCES: dict[str, tuple[Any, ...]] = {
    # bf16 autocast is what every modern recipe trains in (nanoGPT, modded-nanogpt, llm.c); fp16
    # (with a GradScaler) before Ampere, which has no bf16 (check_supported picks the next).
    "amp_dtype": ("bfloat16", "float16", "tf32", "float32"),
    # FlashAttention-2 (Dao 2023) is the fused kernel every recipe above uses; cuDNN next (as fast
    # or faster on Hopper per the PyTorch 2.5 release notes, but with fewer supported shapes).
    "sdpa_backend": ("flash", "cudnn", "efficient", "auto", "math"),
    # Compile pays from the first minute of a real run; "default" compiles in tens of seconds,
    # max-autotune in minutes per trial (search_spaces/gpt2.yaml).
    "compile_mode": ("default", "max-autotune-no-cudagraphs", "reduce-overhead", "max-autotune", "none"),
    # The head and the loss hold 31 % of GPT-2 124M's matmul FLOPs (gpt2.yaml); compiling them with
    # the blocks keeps compile time flat in depth (one block graph) where a whole-model graph does not.
    "compile_scope": ("blocks+head", "model", "blocks"),
    # Packed windows: one static shape (no recompiles, no pads), as llm.c and modded-nanogpt train.
    "batching": ("packed", "padded"),
    "attention_mask": ("causal", "document"),  # flash runs causal attention only
    "loss_impl": ("standard", "chunked"),  # the budget estimate below counts the full logits
    # The checklist's DataLoader: 4 workers, pinned memory, prefetch 4, kept across epochs.
    "num_workers": (4, 8, 2, 0),
    "pin_memory": (True, False),
    "prefetch_factor": (4, 8, 2),
    "persistent_workers": (True, False),
    "expandable_segments": (False, True),
}
# benchmarks/data/cpu_gpt2_tiny_sweep.json (48 configurations, 2-core VM, 2026-11-29): the best
# was float32 + flash at 4096 tokens, unchekpointed, 109k tok/s. bfloat16 was 1.5-2.4x slower
# at every budget (this CPU has no bf16 matrix units), flash beat math at 4096 tokens (109k vs
# 71k), 4096 beat 8192 (76k) and 2048 (72k), and each checkpointed block cost 20-40 %. The
# sweep fixed num_workers=0 and padded batches (on two cores a worker takes a core from the
# step) and ran no compile (tens of seconds per trial on a CPU).
CPU_PREFERENCES: dict[str, tuple[Any, ...]] = {
    "amp_dtype": ("float32", "bfloat16"),
    "sdpa_backend": ("flash", "math", "auto"),
    "compile_mode": ("none", "default"),
    "batching": ("padded", "packed"),
    "attention_mask": ("causal",),
    "loss_impl": ("standard", "chunked"),
    "num_workers": (0, 1, 2),
    "pin_memory": (False,),
    "persistent_workers": (False, True),
    "expandable_segments": (False,),
}
CPU_TOKEN_BUDGET = 4096  # the sweep's best budget; the largest the space offers at or below it

# --- how much memory a budget takes (CUDA) ------------------------------------------------------
# Per parameter: fp32 weights, gradients and AdamW's two moments.
STATE_BYTES_PER_PARAM = 16
# Per token and layer: 34 x d_model bytes of 16-bit activations with a fused attention kernel
# (Korthikanti et al. 2022, eq. 1 without the 5as/h term flash attention never stores).
ACTIVATION_BYTES_PER_TOKEN_LAYER_PER_WIDTH = 34
# Per token and vocabulary entry, the standard loss: bf16 logits, their fp32 copy for the
# softmax, its gradient in fp32 and bf16 (benchmarks/loss_memory.py measured 589.5 KiB of peak per
# token at GPT-2's 50304 entries: 12.0 bytes each).
LOGIT_BYTES_PER_TOKEN_ENTRY = 12
# "Likely to fit": the estimate times this must fit. Autocast keeps fp32 copies the formula
# leaves out (the residual stream, layer-norm inputs) and the caching allocator rounds blocks up.
LIKELY_FIT_FACTOR = 1.25
RESERVED_BYTES = 2**30  # CUDA context, cuBLAS/cuDNN workspaces, compile's autotuning buffers


def estimated_peak_bytes(model: ModelDims, token_budget: int) -> int:
    per_token = (
        ACTIVATION_BYTES_PER_TOKEN_LAYER_PER_WIDTH * model.d_model * model.n_layer
        + LOGIT_BYTES_PER_TOKEN_ENTRY * model.vocab_size
    )
    return STATE_BYTES_PER_PARAM * model.n_params + per_token * token_budget + RESERVED_BYTES


def expert_configs(
    device_info: DeviceInfo,
    space: SearchSpace,
    *,
    memory_limit_bytes: int | None = None,
    model: ModelDims | None = None,
) -> list[dict[str, Any]]:
    """The Optuna params of the expert start on this device, each valid in `space` (clipped to
    it, within its rules, supported by the device); empty when the space leaves no such
    configuration. On CUDA, `memory_limit_bytes` and `model` choose the budget; without them,
    the middle of the space's budgets."""
    caps = DeviceCapabilities.detect(device_info.kind, device_info.capability_tuple)
    if device_info.kind == "cuda":
        preferences = dict(CUDA_PREFERENCES)
        budget = _cuda_budget(space, memory_limit_bytes, model)
    else:
        preferences = dict(CPU_PREFERENCES)
        budget = _at_most(_budget_choices(space), CPU_TOKEN_BUDGET)
    if budget is not None:
        preferences["token_budget"] = (budget,)
    params = _clip(space, preferences, caps)
    return [params] if params is not None else []


def enqueue_expert_start(study: optuna.Study, ctx: Any) -> int:
    """Enqueue the expert start of a StudyContext's device, space, limit and model; returns how
    many configurations. (Typed loosely: study.lifecycle imports this module, not the reverse.)"""
    configs = expert_configs(ctx.device, ctx.space, memory_limit_bytes=ctx.memory_limit_bytes, model=ctx.model_dims)
    label = f"{ctx.device.kind}-expert"
    for params in configs:
        study.enqueue_trial(params, user_attrs={EXPERT_ATTR: label}, skip_if_exists=False)
    if not configs:
        log.info("expert start: no expert configuration lies in this space; TPE starts from the references")
    return len(configs)


# --- choosing within the space ---------------------------------------------------------------------


def _budget_choices(space: SearchSpace) -> list[int]:
    """The token budgets the space offers: its choices, or a range seen at its ends and the
    powers of two on its grid (budgets are powers of two in every shipped space)."""
    dim = space.dimensions.get("token_budget")
    if dim is None:
        return []
    return sorted(dim.choices) if dim.choices is not None else _range_points(dim)


def _range_points(dim) -> list[int]:
    low, high = dim.low, int(dim.high)
    points, b = {low, high}, 1
    while b <= high:
        if b >= low and (dim.log or (b - low) % dim.step == 0):
            points.add(b)
        b *= 2
    return sorted(points)


def _at_most(budgets: Sequence[int], cap: int) -> int | None:
    if not budgets:
        return None
    fitting = [b for b in budgets if b <= cap]
    return max(fitting) if fitting else min(budgets)


def _cuda_budget(space: SearchSpace, limit: int | None, model: ModelDims | None) -> int | None:
    budgets = _budget_choices(space)
    if not budgets:
        return None
    if limit is None or model is None:
        # No shape to estimate from (a user's factory): the middle budget, and TPE and the memory
        # model move it from there.
        return budgets[(len(budgets) - 1) // 2]
    fitting = [b for b in budgets if LIKELY_FIT_FACTOR * estimated_peak_bytes(model, b) <= limit]
    return max(fitting) if fitting else min(budgets)


def _clip(space: SearchSpace, preferences: Mapping[str, Sequence[Any]], caps: DeviceCapabilities) -> dict | None:
    """The params of the most preferred configuration the space offers and this device runs.
    A broken rule or an unsupported knob drops that knob's choice and tries the next one."""
    banned: dict[str, set] = {}
    for _ in range(64):  # every retry bans one value: bounded by the values of the space
        values = _pick(space, preferences, banned)
        try:
            cfg = _to_config(space, values)
        except UsageError:
            return None
        culprit = _broken_rule_knob(space, cfg) or _unsupported_knob(cfg, caps)
        if culprit is None:
            return params_for(space, cfg)
        if culprit not in space.dimensions or culprit not in values:
            return None  # a fixed knob breaks it: nothing to choose
        banned.setdefault(culprit, set()).add(values[culprit])
    return None


def _pick(space: SearchSpace, preferences: Mapping[str, Sequence[Any]], banned: Mapping[str, set]) -> dict:
    values: dict[str, Any] = dict(space.fixed)
    defaults = TrainConfig().to_dict()
    for name, dim in space.dimensions.items():
        if dim.when and not matches(dim.when, {**defaults, **values}):
            continue
        offered = list(dim.choices) if dim.choices is not None else _range_points(dim)
        allowed = [v for v in offered if v not in banned.get(name, set())] or offered
        wanted = [v for v in preferences.get(name, ()) if v in allowed]
        values[name] = wanted[0] if wanted else _nearest(allowed, preferences.get(name, ()))
    if space.checkpoint is not None:
        counts = space.checkpoint.count
        offered = list(counts.choices) if counts.choices is not None else [counts.low]
        values["checkpoint_count"] = min(offered)  # no checkpointing: experts checkpoint only to fit
    return values


def _nearest(offered: list, wanted: Sequence[Any]) -> Any:
    """An integer preference the space does not offer exactly: the nearest it does; else its first value."""
    target = next((w for w in wanted if isinstance(w, int) and not isinstance(w, bool)), None)
    numbers = [v for v in offered if isinstance(v, int) and not isinstance(v, bool)]
    if target is not None and numbers:
        return min(numbers, key=lambda v: (abs(v - target), v))
    return offered[0]


def _to_config(space: SearchSpace, values: Mapping[str, Any]) -> TrainConfig:
    params = {k: v for k, v in values.items() if k not in space.fixed}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # FixedTrial warns about params a condition leaves unasked
        return suggest(space, FixedTrial(params))


def _broken_rule_knob(space: SearchSpace, cfg: TrainConfig) -> str | None:
    values = cfg.to_dict()
    for rule in space.rules:
        if matches(rule.when, values) and not matches(rule.require, values):
            return next(iter(rule.when))  # the knob whose choice brings the rule into play
    return None


def _unsupported_knob(cfg: TrainConfig, caps: DeviceCapabilities) -> str | None:
    try:
        check_supported(cfg, caps)
    except UnsupportedConfig as exc:
        return exc.knob
    return None
