"""What a training run reached against what its recipe recorded, and when short, why.

Torch-free: it reads two dicts of figures under the recipe's own names (`measured` of a
recipe file, `RunMeter.figures()` of a run), so `autotune verify --from RUN.json` judges a
meter's file with it too.

The run is short when its effective tokens/s is below the lower of the recipe's 95 % interval
and the recorded rate less verify's tolerance (`default_tolerance`, verify's: 5 % on a
GPU, 15 % on a CPU, where fresh processes of one configuration spread that much). Each cause
compares one figure with the recipe's; every cause found is named, short or not, since each
one (a recompile, memory above the record, a knob not applied) is worth knowing even when
the rate held. The causes, in the order they are named:

    data        the loop waited for data DATA_WAIT_MARGIN more of the step than the recipe did
    padding     the share of real (non-pad) targets is PADDING_MARGIN below the recipe's
    recompile   torch compiled or recorded something after warm-up (every one is a stall)
    memory      the peak is MEMORY_MARGIN above the recipe's, read from the same source
    knob        a knob of the recipe is not in effect on the model trained (`RunMeter` checks)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from autotune.units import format_bytes

DATA_WAIT_MARGIN = 0.05  # of the step: a loader that keeps up waits ~0, one that does not, much more
PADDING_MARGIN = 0.05  # of the positions: length-grouped batches of one corpus vary by about 1-2 %
MEMORY_MARGIN = 0.05  # RSS and NVML readings of one configuration vary by a few percent

# A GPU step is long and steady: a recipe should reproduce within a few percent. On a CPU,
# fresh processes of the same configuration spread by 6-12% (coefficient of variation, 2-core
# VM, benchmarks/fidelity.py), so 5% would fail a faithful recipe about half the time.
GPU_TOLERANCE, CPU_TOLERANCE = 0.05, 0.15


def default_tolerance(device: str) -> float:
    return CPU_TOLERANCE if device.split(":", 1)[0] == "cpu" else GPU_TOLERANCE


MATCHES, SHORT, FAULTS, UNRECORDED, TOO_FEW = "matches", "short", "faults", "unrecorded", "too-few-steps"


@dataclass(frozen=True)
class Verdict:
    """status: matches, short (below the recipe's rate), faults (the rate held, a cause was
    found), unrecorded (the recipe records no tokens/s), too-few-steps (nothing measured yet)."""

    status: str
    line: str
    causes: list[str] = field(default_factory=list)
    ratio_tokens_per_sec: float | None = None
    bar_tokens_per_sec: float | None = None  # below this, the run is short


def judge(run: Mapping[str, Any], recorded: Mapping[str, Any], *, device_kind: str) -> Verdict:
    """The verdict of a run's figures against a recipe's recorded ones (see the module docstring)."""
    rate = run.get("tokens_per_sec")
    if not _number(rate):
        return Verdict(TOO_FEW, f"{TOO_FEW}: no step measured after the {run.get('warmup_steps', 0)} of warm-up")
    causes = [why for check in CAUSES if (why := check(run, recorded)) is not None]
    said = f"{rate:,.0f} tokens/s"
    recorded_rate = recorded.get("tokens_per_sec")
    if not _number(recorded_rate) or recorded_rate <= 0:
        return Verdict(UNRECORDED, _line(f"{UNRECORDED}: {said}; the recipe records no tokens/s", causes), causes)
    ratio = rate / recorded_rate
    bar = short_bar(recorded_rate, recorded.get("tokens_per_sec_ci95"), default_tolerance(device_kind))
    against = f"{said}, {ratio:.2f}x the recipe's {recorded_rate:,.0f} (short below {bar:,.0f})"
    if rate < bar:
        return Verdict(
            SHORT, _line(f"{SHORT}: {against}", causes or ["no cause found in the figures"]), causes, ratio, bar
        )
    if causes:
        return Verdict(FAULTS, _line(f"reached, with faults: {against}", causes), causes, ratio, bar)
    return Verdict(MATCHES, f"{MATCHES}: {against}", causes, ratio, bar)


def short_bar(recorded_rate: float, interval: Any, tolerance: float) -> float:
    """The rate below which a run is short: the lower of the recorded 95 % interval's low end
    and the recorded rate less the tolerance (an interval says one run's noise; two processes
    differ more, which is what the tolerance is for)."""
    bar = (1 - tolerance) * recorded_rate
    if isinstance(interval, (list, tuple)) and len(interval) == 2 and _number(interval[0]):
        bar = min(bar, float(interval[0]))
    return bar


def _line(head: str, causes: list[str]) -> str:
    return f"{head}; likely: {'; '.join(causes)}" if causes else head


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _data_wait(run: Mapping[str, Any], recorded: Mapping[str, Any]) -> str | None:
    waited, before = run.get("data_wait_fraction"), recorded.get("data_wait_fraction") or 0.0
    if _number(waited) and waited > before + DATA_WAIT_MARGIN:
        return (
            f"the loop waited for data {waited:.0%} of the time (the recipe {before:.0%}): "
            "more workers or a faster collate"
        )
    return None


def _padding(run: Mapping[str, Any], recorded: Mapping[str, Any]) -> str | None:
    padded, before = run.get("padding_fraction"), recorded.get("padding_fraction")
    if _number(padded) and _number(before) and (1 - padded) < (1 - before) - PADDING_MARGIN:
        return (
            f"padding grew: {1 - padded:.0%} of the positions are real targets (the recipe {1 - before:.0%}): "
            "batches as the recipe makes them (recipe.dataloader)"
        )
    return None


def _recompiles(run: Mapping[str, Any], recorded: Mapping[str, Any]) -> str | None:
    count = run.get("recompiles_during_run")
    if _number(count) and count > 0:
        return f"torch compiled {count} time(s) after warm-up (a new shape or a guard failed): each is a stall"
    return None


def _memory(run: Mapping[str, Any], recorded: Mapping[str, Any]) -> str | None:
    peak, before = run.get("peak_memory_bytes"), recorded.get("peak_memory_bytes")
    source, recorded_source = run.get("peak_memory_source"), recorded.get("peak_memory_source")
    if not (_number(peak) and _number(before) and before > 0) or (recorded_source and source != recorded_source):
        return None  # two figures of different sources (RSS, NVML, the allocator) do not compare
    if peak > before * (1 + MEMORY_MARGIN):
        return f"peak memory {format_bytes(int(peak))} is above the recipe's {format_bytes(int(before))} ({source})"
    return None


def _knobs(run: Mapping[str, Any], recorded: Mapping[str, Any]) -> str | None:
    missing = run.get("knobs_not_in_effect") or []
    return "not in effect on the model: " + "; ".join(missing) if missing else None


CAUSES: tuple[Callable[[Mapping[str, Any], Mapping[str, Any]], str | None], ...] = (
    _data_wait,
    _padding,
    _recompiles,
    _memory,
    _knobs,
)
