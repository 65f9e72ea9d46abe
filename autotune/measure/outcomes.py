"""Trial outcomes, decided here and nowhere else.

    ok                  measured, within the memory limit
    over_memory_limit   measured, but its peak memory is above the limit (infeasible)
    diverged            measured, but the training loss ended NaN or infinite, or generation's
                        greedy tokens left the eager float32 reference's: the speed of a run that
                        does not train, or generates something else, is no answer (never the best)
    recompiled          measured, but something compiled or recorded a CUDA graph while the
                        generation runs were timed: in use it would too, and the figures hold
                        compiler time (infeasible, never the best; a generation trial's
                        `recompiles` constraint)
    predicted_over_limit  not run: the study's memory model (search.memory_model) predicts its
                        peak over the limit by a clear margin, from trials of the same knobs at
                        other token budgets (infeasible, never the best)
    oom                 ran out of memory (allocator error, MemoryError or the OOM killer)
    unsupported         this device cannot run the configuration (never retried)
    timeout             killed, with its whole process group, at the trial timeout
    crashed             died (signal, fatal error) or raised something unexpected
    interrupted         stopped by the user (Ctrl-C), or by SIGTERM / SIGHUP
    killed              killed by a signal from outside (kill -9 of the trial, not the OOM killer):
                        no fault of the configuration, and nothing learnt of its memory

Every place that learns how a run ended (the measuring loop, the trial process and its
parent, the study, `verify`) asks a function of this module, and records what it returns.
This module imports no torch: it is read by the study side too.
"""

from __future__ import annotations

import enum
import math
import signal
import sys
import traceback
from typing import Mapping

from autotune.errors import UnsupportedConfig
from autotune.units import format_bytes


class Outcome(str, enum.Enum):
    """How a run ended (the table above). A str: stored, compared and printed as its name, so
    a study written before the enum reads the same."""

    OK = "ok"
    OVER_MEMORY_LIMIT = "over_memory_limit"
    DIVERGED = "diverged"
    OOM = "oom"
    UNSUPPORTED = "unsupported"
    TIMEOUT = "timeout"
    CRASHED = "crashed"
    INTERRUPTED = "interrupted"
    PREDICTED_OVER_LIMIT = "predicted_over_limit"
    KILLED = "killed"
    RECOMPILED = "recompiled"

    __str__ = str.__str__  # "ok", not "Outcome.OK", in messages and f-strings
    __format__ = str.__format__

    @classmethod
    def read(cls, value: object) -> "Outcome | None":
        """A stored outcome as the enum; None for none, or a name no autotune wrote."""
        try:
            return cls(value) if value is not None else None
        except ValueError:
            return None


OK = Outcome.OK
OVER_MEMORY_LIMIT = Outcome.OVER_MEMORY_LIMIT
DIVERGED = Outcome.DIVERGED
OOM = Outcome.OOM
UNSUPPORTED = Outcome.UNSUPPORTED
TIMEOUT = Outcome.TIMEOUT
CRASHED = Outcome.CRASHED
INTERRUPTED = Outcome.INTERRUPTED
PREDICTED_OVER_LIMIT = Outcome.PREDICTED_OVER_LIMIT
KILLED = Outcome.KILLED
RECOMPILED = Outcome.RECOMPILED

# Outcomes that measured a throughput the sampler can learn from.
MEASURED = (OK, OVER_MEMORY_LIMIT, RECOMPILED)
# Outcomes that say "this region does not fit": recorded as infeasible, not as failures.
INFEASIBLE = (OVER_MEMORY_LIMIT, OOM)
# Outcomes whose recorded peak memory is a measurement of the whole run (a diverged run's
# memory is real even though its speed is no answer): what the memory model fits.
MEASURED_MEMORY = (OK, OVER_MEMORY_LIMIT, DIVERGED, RECOMPILED)
# The memory constraint of an infeasible trial whose peak is unknown (it ran out of memory, or
# the CPU watchdog stopped it): "over by an unknown amount", counted as twice the limit.
UNKNOWN_EXCESS = 1.0

# The signals that ask a process to stop, handled alike: Ctrl-C, `kill`/`timeout`/systemd/
# Slurm/Kubernetes, and a closed terminal.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

# A configuration is feasible only if its worst-case peak stays this fraction below the limit.
# 5 %: what a measured worst case cannot see grows a long run's memory by a few percent -
# allocator fragmentation as shapes alternate for hours (the caching allocator's reserved
# figure runs a few percent above its allocated peak), and NCCL buffers, checkpoint saves and
# evaluation steps that a tuning run never makes; so the recipe keeps that much room, and a
# configuration at 99.9 % of the limit is not as feasible as one at 60 %.
DEFAULT_MEMORY_HEADROOM = 0.05

# On CPU, a trial whose resident memory passes this multiple of the limit is stopped early:
# it is already infeasible, and letting it grow could take the machine down with it.
RSS_KILL_FACTOR = 1.5


class Recording(enum.Enum):
    """How a study records a trial that ended with some outcome."""

    MEASURED = "measured"  # its tokens/s is the value, its peak memory the constraint
    INFEASIBLE = "infeasible"  # value 0, constraint violated: the sampler learns "does not fit"
    PRUNED = "pruned"  # cannot run here: no value, never retried
    FAILED = "failed"  # timeout, crash, interruption: Optuna's FAIL, with the reason


def recording(outcome: str, *, has_rate: bool) -> Recording:
    if outcome in MEASURED and has_rate:
        return Recording.MEASURED
    if outcome in INFEASIBLE or outcome == PREDICTED_OVER_LIMIT:
        # oom, or over_memory_limit without a rate (the CPU RSS watchdog stopped it early)
        return Recording.INFEASIBLE
    if outcome in (UNSUPPORTED, DIVERGED):
        # Pruned: never the best, never retried, and TPE ranks pruned trials below every
        # complete one, so it learns to avoid a configuration that does not train.
        return Recording.PRUNED
    return Recording.FAILED


def skipped_over_limit(predicted_peak_bytes: int, limit_bytes: int, headroom: float, basis: str) -> tuple[str, str]:
    """A configuration the memory model predicts over the limit less the headroom (what a
    feasible peak may be): not run."""
    over = f"the limit {format_bytes(limit_bytes)}"
    if headroom:
        over += f" less {headroom:.0%} headroom ({format_bytes(feasible_peak_bytes(limit_bytes, headroom))})"
    return PREDICTED_OVER_LIMIT, f"not run: peak predicted {format_bytes(predicted_peak_bytes)}, over {over} ({basis})"


def reusable(outcome: str) -> bool:
    """Whether a finished trial's outcome stands for its configuration when it is proposed again.
    A prediction does not: with more trials the model may say otherwise, and then it runs."""
    return outcome != PREDICTED_OVER_LIMIT


# --- inside the measurement ------------------------------------------------------------------


def decide_measured(
    peak_memory_bytes: int | None,
    memory_limit_bytes: int | None,
    *,
    final_loss: float | None = None,
    headroom: float = 0.0,
) -> tuple[str, str | None]:
    """A run that finished is ok unless its loss is not finite at the end of the timed steps
    (diverged: it does not train, whatever its speed) or its worst-case peak breaks the limit
    less the headroom (what a feasible peak may be: ok and feasible are one rule)."""
    if final_loss is not None and not math.isfinite(final_loss):
        return DIVERGED, f"the training loss is {final_loss} after the timed steps: the run does not train"
    if memory_limit_bytes is None or peak_memory_bytes is None:
        return OK, None
    allowed = feasible_peak_bytes(memory_limit_bytes, headroom)
    if peak_memory_bytes > allowed:
        limit = f"the limit {format_bytes(memory_limit_bytes)}"
        if headroom:
            limit += f" less {headroom:.0%} headroom ({format_bytes(allowed)})"
        return OVER_MEMORY_LIMIT, f"peak memory {format_bytes(peak_memory_bytes)} is above {limit}"
    return OK, None


def decide_generated(
    peak_memory_bytes: int | None,
    memory_limit_bytes: int | None,
    *,
    divergence: str | None,
    recompiles: int,
    headroom: float = 0.0,
) -> tuple[str, str | None]:
    """A generation run that finished: diverged when its greedy tokens left the reference's
    (`divergence` says where), recompiled when anything compiled while it was timed, else as
    memory decides (`decide_measured`)."""
    if divergence is not None:
        return DIVERGED, divergence
    if recompiles:
        return RECOMPILED, (
            f"{recompiles} compile event(s) while the generations were timed (a recompile or a CUDA graph "
            "recorded): it would recompile in use, and the figures hold compiler time"
        )
    return decide_measured(peak_memory_bytes, memory_limit_bytes, headroom=headroom)


def feasible_peak_bytes(memory_limit_bytes: int, headroom: float) -> int:
    """The most a feasible configuration's worst-case peak may be: the limit less the headroom."""
    return int(memory_limit_bytes * (1 - headroom))


def memory_constraint(peak_memory_bytes: int | None, memory_limit_bytes: int, headroom: float) -> float:
    """The study's memory constraint (feasible when <= 0): the worst-case peak against the
    limit less the headroom, as a fraction of the limit. A run with no peak figure is not
    held against it (0)."""
    if peak_memory_bytes is None:
        return 0.0
    return (peak_memory_bytes - feasible_peak_bytes(memory_limit_bytes, headroom)) / memory_limit_bytes


def classify_exception(exc: BaseException) -> tuple[str, str]:
    """(outcome, one-line reason) for an exception raised by a measurement."""
    if isinstance(exc, UnsupportedConfig):
        return UNSUPPORTED, str(exc)
    if is_sdpa_unsupported_error(exc):
        return UNSUPPORTED, "sdpa_backend: the forced attention backend cannot run these inputs (" + _first_line(
            exc
        ) + ")"
    if _is_oom(exc):
        return OOM, "out of memory: " + _first_line(exc)
    mark = kernel_unsupported_mark(exc)
    if mark is not None:
        return UNSUPPORTED, f"no kernel for this configuration on this device ({_first_line(mark)})"
    return CRASHED, f"{type(exc).__name__}: {_first_line(exc)}\n{_tail(traceback.format_exception(exc))}"


def is_sdpa_unsupported_error(exc: BaseException) -> bool:
    """The errors torch raises when a forced SDPA backend cannot run these inputs."""
    text = str(exc)
    return isinstance(exc, RuntimeError) and (
        "No viable backend for scaled_dot_product_attention" in text or "No available kernel" in text
    )


# What the kernel libraries say when they have no kernel for a configuration on this device:
# the configuration cannot run here, which is `unsupported` (never retried), not a crash. The
# texts are matched in the exception and what it was raised from (inductor wraps what it catches).
KERNEL_UNSUPPORTED_MARKS = (
    "CUDNN_STATUS_NOT_SUPPORTED",  # cuDNN: no engine for these shapes, dtypes or layouts
    "No execution plans support the graph",  # cuDNN frontend (cuDNN attention)
    "No valid execution plans built",  # cuDNN frontend, v1 API
    "Unable to find a valid cuDNN algorithm",  # cuDNN convolution algorithm search
    "CUBLAS_STATUS_NOT_SUPPORTED",  # cuBLAS(Lt): no kernel for this matmul
    "CUBLAS_STATUS_ARCH_MISMATCH",  # cuBLAS: the GPU lacks the feature (e.g. bf16 before Ampere)
    "no kernel image is available for execution on the device",  # torch or a library built without this GPU's arch
    "FlashAttention only supports",  # flash-attention's architecture and head-dim checks
    "NoValidChoicesError",  # inductor max-autotune: no template can run this matmul
    "out of resource: shared memory",  # Triton: a kernel config needs more shared memory than this GPU has
)
# Allocation failures inside the kernel libraries are out of memory, whatever they are called.
_LIBRARY_OOM_MARKS = ("CUDNN_STATUS_ALLOC_FAILED", "CUBLAS_STATUS_ALLOC_FAILED")


def kernel_unsupported_mark(exc: BaseException) -> BaseException | None:
    """The exception in `exc`'s chain that says no kernel exists for this configuration, or None."""
    for link in _chain(exc):
        text = f"{type(link).__name__}: {link}"
        if any(mark in text for mark in KERNEL_UNSUPPORTED_MARKS):
            return link
    return None


def _chain(exc: BaseException) -> list[BaseException]:
    """`exc`, then what it was raised from (`raise ... from`; cycle-safe). Not the implicit
    context: an error raised while handling another one was not caused by it."""
    seen: list[BaseException] = []
    link: BaseException | None = exc
    while link is not None and all(link is not s for s in seen):
        seen.append(link)
        link = link.__cause__
    return seen


def _is_oom(exc: BaseException) -> bool:
    torch = sys.modules.get("torch")  # an exception from torch means torch is loaded
    oom_types = (MemoryError, torch.OutOfMemoryError) if torch is not None else (MemoryError,)
    for link in _chain(exc):
        text = str(link)
        if isinstance(link, oom_types) or any(mark in text for mark in _LIBRARY_OOM_MARKS):
            return True
        if isinstance(link, RuntimeError) and "out of memory" in text.lower():
            return True
    return False


def bad_input_in_trial(exc: BaseException) -> tuple[str, str]:
    """A usage error that reached a trial process (the tuner validates first, so this is a
    model or data that fails only when built): recorded as a crash, with its message."""
    return CRASHED, str(exc)


# --- around the trial process ------------------------------------------------------------------


def timed_out(timeout_s: float) -> tuple[str, str]:
    return TIMEOUT, f"no result after {timeout_s:.0f} s; the process group was killed"


def stopped_over_memory(peak_bytes: int, limit_bytes: int) -> tuple[str, str] | None:
    """The CPU watchdog's verdict on a running trial's resident memory, or None to go on."""
    if peak_bytes <= RSS_KILL_FACTOR * limit_bytes:
        return None
    return OVER_MEMORY_LIMIT, (
        f"resident memory {format_bytes(peak_bytes)} passed {RSS_KILL_FACTOR}x the limit "
        f"{format_bytes(limit_bytes)}; stopped early"
    )


def classify_exit(returncode: int, stderr_tail: str, *, oom_killed: bool | None = None) -> tuple[str, str]:
    """(outcome, reason) for a trial process that exited without writing a result. `oom_killed`:
    whether the kernel's OOM killer killed a process while it ran (None: unknown)."""
    if returncode < 0:
        sig = signal.Signals(-returncode).name if -returncode in signal.Signals._value2member_map_ else str(-returncode)
        if -returncode in STOP_SIGNALS:
            # Not a fault of the configuration: someone stopped it (systemd and Slurm send
            # SIGTERM to every process of a job, the trial included).
            return INTERRUPTED, f"stopped by {sig}\n{stderr_tail}".rstrip()
        if -returncode == signal.SIGKILL:
            if oom_killed is False:
                # The kernel counted no OOM kill meanwhile: someone sent it (kill -9, a scheduler).
                # No fault of the configuration, and nothing to learn of its memory.
                return KILLED, (
                    f"killed by SIGKILL from outside (the kernel recorded no out-of-memory kill)\n{stderr_tail}"
                ).rstrip()
            how = "by the kernel's out-of-memory killer" if oom_killed else "(most likely the kernel's OOM killer)"
            return OOM, f"killed by SIGKILL {how}\n{stderr_tail}".rstrip()
        return CRASHED, f"killed by {sig}\n{stderr_tail}".rstrip()
    return CRASHED, f"exited with status {returncode}\n{stderr_tail}".rstrip()


def interrupted_by_user(signum: int = signal.SIGINT) -> tuple[str, str]:
    how = "the user (Ctrl-C)" if signum == signal.SIGINT else signal.Signals(signum).name
    return INTERRUPTED, f"stopped by {how}; the trial's processes were killed"


def orphaned() -> tuple[str, str]:
    return INTERRUPTED, "its tuner process was killed; failed at resume"


# --- judging a re-measurement (verify) ------------------------------------------------------------


def reproduction_failures(
    *,
    outcome: str,
    reason: str | None,
    tokens_per_sec: float | None,
    recorded_tokens_per_sec: float,
    tolerance: float,
    peak_memory_bytes: int | None,
    memory_limit_bytes: int | None,
) -> list[str]:
    """Why a re-measured recipe does not reproduce its record; empty when it does."""
    failures = []
    if outcome not in MEASURED or outcome == RECOMPILED:  # a run that recompiled while timed is no reproduction
        failures.append(f"the run ended {outcome}" + (f": {reason.splitlines()[0]}" if reason else ""))
    if tokens_per_sec is not None and tokens_per_sec < (1 - tolerance) * recorded_tokens_per_sec:
        failures.append(
            f"tokens/s is {tokens_per_sec / recorded_tokens_per_sec:.2f}x the recorded, below the "
            f"{1 - tolerance:.2f}x allowed"
        )
    if memory_limit_bytes is not None and peak_memory_bytes is not None and peak_memory_bytes > memory_limit_bytes:
        failures.append(
            f"peak memory {format_bytes(peak_memory_bytes)} is above the limit {format_bytes(memory_limit_bytes)}"
        )
    if tokens_per_sec is None and not failures:
        failures.append("the run measured no tokens/s")
    return failures


LATENCIES = {"token_latency_p99_s": "p99 time per token", "ttft_p99_s": "p99 time to first token"}


def latency_failures(recorded: Mapping[str, object], measured: Mapping[str, object], tolerance: float) -> list[str]:
    """Why a re-measured generation recipe's latencies do not reproduce its record: each p99 above
    the recorded by more than tokens/s may fall below it (1 / (1 - tolerance): the same allowance,
    as a time)."""
    failures = []
    for key, what in LATENCIES.items():
        was, now = recorded.get(key), measured.get(key)
        if isinstance(was, (int, float)) and was > 0 and isinstance(now, (int, float)) and now * (1 - tolerance) > was:
            failures.append(f"{what} is {now / was:.2f}x the recorded, above the {1 / (1 - tolerance):.2f}x allowed")
    return failures


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def _tail(lines: list[str], n: int = 12) -> str:
    return "\n".join("".join(lines).rstrip().splitlines()[-n:])
