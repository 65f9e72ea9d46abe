"""`autotune plan`: will a model train on a card, with which settings, and what would the search try
first there, before anyone pays for the card. A model, not a measurement: every figure is the
search's own, asked of a card from the table beside the peak FLOPs (`device.flops.CARDS`) or of
this machine's device:

- memory: the search's memory model (`search.memory_model`: the analytic prior before any trial,
  fitted to a study's measured peaks with --study), per family of the knobs that move it (dtype x
  attention kernel x loss x checkpointed blocks, the other knobs at their defaults);
- the first trials: the search's planner built for that device (`search.sampler.planner_for`),
  asked as the sampler asks it before any trial has finished;
- the ceiling: the card's dense peak over the model's FLOPs per token (100 % MFU).

Torch-free: a named model's shape is read from `model.sizes`; a user's model is built by the
search's probe in a child process (`search.training.TrainTask.resolve`)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterator, Mapping, Sequence

from autotune.config import TrainConfig
from autotune.device import describe, resolve_device
from autotune.device.flops import CARDS, measured_peak_flops, peak_flops
from autotune.errors import UnsupportedConfig, UsageError
from autotune.knobs.support import DeviceCapabilities, check_supported
from autotune.measure import outcomes
from autotune.search import priors
from autotune.search.memory_model import MemoryModel, memory_context, observations_from_records
from autotune.search.preflight import DEFAULT_TRIAL_TIMEOUT_S, memory_headroom, memory_limit
from autotune.search.settings import SearchSettings
from autotune.search.task import Basics
from autotune.search.training import TrainTask, _token_budgets
from autotune.study.leaders import DEFAULT_OBJECTIVE
from autotune.study.study_record import StudyRecord

# The prior's error measured against real runs, predicted / measured peak - 1 (docs/plan.md,
# benchmarks/plan_accuracy.py, benchmarks/results/2026-12-05/plan_accuracy.json): its range, and
# where. A test fails when these stop being that file's.
MEASURED_ERROR = (-0.38, +0.13)
MEASURED_ON = "37 runs of gpt2-tiny and gpt2 on this project's CPU (peak RSS of autotune bench), 2026-12-05"
VALIDATED = (
    f"Validated on {MEASURED_ON}: the prior {MEASURED_ERROR[0]:+.0%} to {MEASURED_ERROR[1]:+.0%} of the measured "
    "peak (negative: below it); no GPU run has checked it yet (docs/plan.md)."
)
# A budget within the measured error: its peak predicted with the prior raised by the most it fell short.
MARGIN = -math.log(1 + min(0.0, MEASURED_ERROR[0]))
LIKELY = 0.5  # the planner's MIN_FIT: a budget "fits" when the model gives it at least this chance
Z95 = 1.96
FUSED = ("flash", "efficient")  # attention that keeps no T x T scores: the first this device runs


@dataclasses.dataclass(frozen=True, kw_only=True)
class CardTask(TrainTask):
    """The training task on a card this machine does not have: the card's machine runs torch's
    CUDA wheels, which ship triton, whatever this one has."""

    @property
    def capabilities(self) -> DeviceCapabilities:
        return DeviceCapabilities(self.device.kind, self.device.capability_tuple)


def plan_task(settings: SearchSettings, gpu: str) -> TrainTask:
    """The training study's context on `gpu` (a card of `CARDS`, or `current`: this machine's
    device), resolved as the search resolves it: the model's shape, the space, the limit."""
    from autotune.model.load import check_model_name

    if ":" not in settings.model:
        check_model_name(settings.model)  # a name of ours, or one line; imports nothing
    if gpu == "current":
        name = resolve_device("auto")
        device = describe(name)
    elif gpu in CARDS:
        name, device = "cuda:0", CARDS[gpu].device()
    else:
        raise UsageError(f"unknown card {gpu!r}: expected {', '.join(CARDS)} or current")
    limit, headroom = memory_limit(settings, device), memory_headroom(settings)
    return _resolve(settings, name, device, limit, headroom, virtual=gpu != "current")


def study_task(name: str | None, storage: str | None) -> tuple[TrainTask, list[Any]]:
    """A training study's context (its model, device, limit and headroom) and its trials."""
    from autotune.device.info import DeviceInfo
    from autotune.study.record import read_trials
    from autotune.study.storage import load_study

    study = load_study(name, storage)
    record = StudyRecord.read(study.user_attrs)
    if record.task != TrainTask.name or not record.model or record.memory_limit_bytes is None:
        raise UsageError(f"study {study.study_name!r} is no training study with a memory limit: plan reads those")
    device = DeviceInfo.from_dict(record.hardware)
    settings = SearchSettings(
        model=record.model, seq_len=record.seq_len, global_batch_tokens=record.run.global_batch_tokens
    )
    where = "cuda:0" if device.kind == "cuda" else "cpu"
    task = _resolve(settings, where, device, record.memory_limit_bytes, record.headroom, virtual=True)
    return task, read_trials(study)


def _resolve(settings: SearchSettings, name: str, device: Any, limit: int, headroom: float, virtual: bool) -> TrainTask:
    kind = CardTask if virtual and device.kind == "cuda" else TrainTask
    timeout = DEFAULT_TRIAL_TIMEOUT_S[device.kind]
    return kind.resolve(settings, Basics(name, device, DEFAULT_OBJECTIVE, timeout, limit, headroom))


def make_plan(task: TrainTask, *, records: Sequence[Any] = (), card: str | None = None) -> dict:
    """The plan, as one JSON object (`present.plan` prints it), but its first trials (`first_trials`:
    the planner takes tens of seconds to list its candidates)."""
    feasible = outcomes.feasible_peak_bytes(task.memory_limit_bytes, task.memory_headroom)
    observations = observations_from_records(records)
    model = MemoryModel(memory_context(task), feasible).fit(observations)
    seq, n_layer = task.space.seq_len, task.space.n_layer or 1
    target = task.spec.global_batch_tokens or max(_token_budgets(task.space) or [TrainConfig().token_budget])
    families = [_family(model, config, seq, target) for config in _family_configs(task)]
    device = task.device
    return {
        "model": task.spec.model,
        "device": {
            "card": card,
            "name": device.name,
            "kind": device.kind,
            "memory_bytes": device.total_memory_bytes,
            "compute_capability": device.compute_capability,
        },
        "seq_len": seq,
        "global_batch_tokens": task.spec.global_batch_tokens,
        "memory_limit_bytes": task.memory_limit_bytes,
        "memory_headroom": task.memory_headroom,
        "feasible_bytes": feasible,
        "calibrated_on": len([o for o in observations if o.peak_bytes]),
        "validated": VALIDATED,
        "target_budget": target,
        "families": families,
        "least_checkpointing": [
            {"config": c, "budget": target, "blocks": _least_blocks(model, c, target, n_layer), "of": n_layer}
            for c in _family_configs(task, blocks=False)
        ],
        "verdict": _verdict(task, model, families, target),
        "ceiling": _ceiling(task),
        "calibration": _calibration(task, feasible, observations),
    }


# --- memory, family by family ----------------------------------------------------------------


def _family_configs(task: TrainTask, *, blocks: bool = True) -> Iterator[dict[str, Any]]:
    """Every family this device runs: float32 and its half precision, math and fused attention,
    both losses; with `blocks`, each count of checkpointed blocks the space offers (first blocks)."""
    from autotune.space.enumerate import dimension_values

    caps, n_layer = task.capabilities, task.space.n_layer or 1
    counts = dimension_values(task.space, task.space.checkpoint.count) if task.space.checkpoint else [0]
    for dtypes in (("float32",), ("bfloat16", "float16")):
        for kernels in (("math",), FUSED):
            for loss in ("standard", "chunked"):
                config = _runnable(caps, dtypes, kernels, loss_impl=loss)
                if config is None:
                    continue
                for count in sorted({min(c, n_layer) for c in counts}) if blocks else [0]:
                    yield {**config, "checkpoint_layers": list(range(count))}


def _runnable(caps: DeviceCapabilities, dtypes: Sequence[str], kernels: Sequence[str], **knobs: Any) -> dict | None:
    """The first of these dtypes and kernels the device runs, the other knobs at their defaults."""
    for dtype in dtypes:
        for kernel in kernels:
            try:
                config = TrainConfig(amp_dtype=dtype, sdpa_backend=kernel, **knobs)
                check_supported(config, caps)
            except (UnsupportedConfig, UsageError):
                continue
            return config.to_dict()
    return None


def _family(model: MemoryModel, config: dict[str, Any], seq: int, target: int) -> dict[str, Any]:
    prior = model.context.prior(config)
    at = model.predict({**config, "token_budget": target})
    return {
        "config": {**config, "token_budget": target},
        "checkpointed": len(config["checkpoint_layers"]),
        "static_bytes": int(prior.static),
        "per_token_bytes": int(prior.per_token),
        "at_target": {**_band(at), "p_fit": at.p_fit},
        # the largest whole number of sequences that fits: likely (50 %); within the measured error;
        # low: its peak's 95 % band fits whole; high: only the band's bottom fits
        "largest_budget": {
            "likely": _largest(model, config, seq),
            "within_error": _largest(model, config, seq, margin=MARGIN),
            "low": _largest(model, config, seq, Z95),
            "high": _largest(model, config, seq, -Z95),
        },
    }


def _band(prediction: Any) -> dict[str, int]:
    """A predicted peak (`memory_model.MemoryPrediction`) and its 95 % interval."""
    return {"peak_bytes": prediction.peak_bytes, "low_bytes": prediction.low_bytes, "high_bytes": prediction.high_bytes}


def _largest(
    model: MemoryModel, config: Mapping[str, Any], seq: int, z: float = 0.0, margin: float = 0.0
) -> int | None:
    """The largest multiple of `seq` whose predicted peak, `z` sd above its median and raised by
    `margin` (of its log), fits; None when not one sequence does."""
    limit = math.log(model.feasible_limit) - margin

    def fits(sequences: int) -> bool:
        mean, sd = model.log_peak({**config, "token_budget": sequences * seq})
        return mean + z * sd <= limit

    if not fits(1):
        return None
    low, high = 1, 2
    while fits(high) and high < 2**30:
        low, high = high, high * 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low * seq


def _least_blocks(model: MemoryModel, config: Mapping[str, Any], budget: int, n_layer: int) -> int | None:
    """The fewest checkpointed blocks (the first ones) with which `budget` tokens likely fit in one
    micro-batch; None when checkpointing all of them does not make it fit."""
    for k in range(n_layer + 1):
        if model.p_fit({**config, "token_budget": budget, "checkpoint_layers": list(range(k))}) >= LIKELY:
            return k
    return None


def _verdict(task: TrainTask, model: MemoryModel, families: list[dict], target: int) -> dict[str, Any]:
    """Whether one sequence fits in the leanest family; if not, by how much and what would make
    it fit (FSDP2's shards, a larger card); if so, what holds the target budget in one micro-batch."""
    seq = task.space.seq_len
    leanest = min(families, key=lambda f: f["static_bytes"] + f["per_token_bytes"] * seq)
    one = model.predict({**leanest["config"], "token_budget": seq})
    trains = one.p_fit >= LIKELY
    remedies = []
    if not trains:
        dims = model.context.dims
        state = priors.STATE_BYTES_PER_PARAM * dims.n_params
        room = model.feasible_limit - (one.peak_bytes - state)
        if room > 0:
            shards = math.ceil(state / room)
            remedies.append(
                f"what would make it fit: FSDP2 over at least {shards} GPUs (the weights, gradients and AdamW "
                f"state, {priors.STATE_BYTES_PER_PARAM} bytes a parameter, sharded; its buffers not counted)"
            )
    else:
        remedies += _target_remedies(task, model, target)
    return {
        "trains": trains,
        "leanest": leanest["config"],
        "one_sequence": _band(one),
        "short_by_bytes": max(0, one.peak_bytes - model.feasible_limit),
        "remedies": remedies,
        "cards": _cards_that_fit(task, model, leanest["config"]),
    }


def _target_remedies(task: TrainTask, model: MemoryModel, target: int) -> list[str]:
    """What holds `target` tokens: the first of the chunked loss, checkpointing, both, or
    accumulating smaller micro-batches that fits, from the fastest family (half precision, fused
    attention, the standard loss, nothing checkpointed)."""
    fast = _runnable(task.capabilities, ("bfloat16", "float16", "float32"), (*FUSED, "math"), loss_impl="standard")
    n_layer = task.space.n_layer or 1
    chunked, hold = {**fast, "loss_impl": "chunked"}, f"to hold {target:,} tokens in one micro-batch:"
    if _least_blocks(model, fast, target, 0) == 0:
        return []
    if _least_blocks(model, chunked, target, 0) == 0:
        return [f"{hold} the chunked loss"]
    for config, how in ((fast, ""), (chunked, "the chunked loss and ")):
        blocks = _least_blocks(model, config, target, n_layer)
        if blocks is not None:
            return [f"{hold} {how}{blocks} of {n_layer} blocks checkpointed"]
    seq = task.space.seq_len
    largest = _largest(model, {**chunked, "checkpoint_layers": list(range(n_layer))}, seq) or 0
    micro = max((d for d in range(seq, largest + 1, seq) if target % d == 0), default=None)
    if micro is None:
        return [f"to reach {target:,} tokens a step: no micro-batch of whole sequences that divides it fits"]
    return [f"to reach {target:,} tokens a step: {target // micro} micro-batches of {micro:,} (accumulated)"]


def _cards_that_fit(task: TrainTask, model: MemoryModel, config: Mapping[str, Any]) -> list[str]:
    """The known cards on which one sequence of the leanest family likely fits, at this
    run's memory fraction and headroom."""
    context = dataclasses.replace(model.context, device_kind="cuda")
    fraction = task.memory_limit_bytes / task.device.total_memory_bytes if task.device.total_memory_bytes else 0.9
    found = []
    for slug, card in CARDS.items():
        limit = outcomes.feasible_peak_bytes(
            int(min(fraction, 1.0) * card.device().total_memory_bytes), task.memory_headroom
        )
        if MemoryModel(context, limit).p_fit({**config, "token_budget": task.space.seq_len}) >= LIKELY:
            found.append(slug)
    return found


# --- the first trials, the ceiling, the calibration ----------------------------------------------


def first_trials(task: TrainTask, n: int) -> list[dict[str, Any]]:
    """The planner's first `n` proposals on this device, as the study's sampler makes them before
    any trial has finished: each later one with the earlier ones running (workers starting together)."""
    from autotune.search.planner import Stop
    from autotune.search.sampler import planner_for

    if not n:
        return []
    planner = planner_for(task, task.spec.seed)
    out: list[dict[str, Any]] = []
    for _ in range(n):
        proposal = planner.propose([], [t["config"] for t in out])
        if isinstance(proposal, Stop):  # nothing left likely to fit
            break
        out.append(
            {
                "config": proposal.config,
                "stage": proposal.stage,
                "reason": proposal.reason,
                **_band(planner.memory.predict(proposal.config)),
                "p_fit": proposal.p_fit,
                "tokens_per_sec": proposal.predicted_tokens_per_sec,
            }
        )
    return out


def _ceiling(task: TrainTask) -> dict[str, Any]:
    """Tokens/s at 100 % MFU: the card's dense peak in its fastest dtype over the model's FLOPs per
    token (6N + 12 L d T, as measure.flops counts them). An upper bound, never a forecast."""
    dims, seq, name = memory_context(task).dims, task.space.seq_len, task.device.name
    per_token = 6 * dims.n_params + 12 * dims.n_layer * dims.d_model * seq
    dtype = next((d for d in ("bfloat16", "float16", "float32") if peak_flops(name, d)), None)
    peak = peak_flops(name, dtype) if dtype else None
    measured = measured_peak_flops(name, dtype) if dtype else None
    return {
        "flops_per_token": per_token,
        "amp_dtype": dtype,
        "peak_flops": peak,
        "tokens_per_sec": peak / per_token if peak else None,
        "measured_peak_flops": measured[0] if measured else None,
        "measured_tokens_per_sec": measured[0] / per_token if measured else None,
    }


def _calibration(task: TrainTask, feasible: int, observations: Sequence[Any]) -> list[dict[str, Any]]:
    """Each measured peak of the study beside the prior's prediction and the model's fitted to
    the other trials (left out: a trial's own peak would predict itself)."""
    context = memory_context(task)
    prior = MemoryModel(context, feasible)
    rows = []
    for o in observations:
        if not o.peak_bytes:
            continue
        others = MemoryModel(context, feasible).fit([x for x in observations if x is not o])
        rows.append(
            {
                "trial": o.trial,
                "config": dict(o.params),
                "measured_bytes": o.peak_bytes,
                "prior_bytes": prior.predict(o.params).peak_bytes,
                "calibrated_bytes": others.predict(o.params).peak_bytes,
            }
        )
    return rows
