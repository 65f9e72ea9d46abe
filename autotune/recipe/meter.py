"""The recipe's promise, checked in your own training run: `RunMeter` measures the loop it is
called from with the definitions, and the code, of autotune's measuring loop (`measure.loop`),
then says what the run reached against what the recipe recorded (`recipe.run_verdict`).

    meter = recipe.meter(model)                   # after apply_to_model: it checks the model trained
    for batch in meter.batches(loader):           # or call meter.step(batch) at the end of each step
        ...                                       # your step, unchanged
    print(meter.verdict())                        # one line; meter.report() a dict, meter.save(path) JSON

The figures, each as the measuring loop defines it:
- effective tokens/s: real targets (labels != -100) over the steps' wall time, data waits
  included; padded tokens/s and the padding fraction beside it;
- data-wait fraction: the time from the end of one step to the start of the next (the batch in
  hand: `meter.batches` times the loader's next(), or a framework's step-begin hook) over the
  steps' time; unknown when only `step` is called;
- step time: the median, and its spread as the CV of the time per modelled FLOP
  (`intervals.time_per_flop_cv`), with the rate's 95 % interval (`intervals.rate_interval`);
- peak memory by the search's source: the process tree's RSS on a CPU (`device.ProcessTreeMemory`),
  NVML's figure for this process on CUDA, else the allocator's reserved peak (`measure.peaks`);
- MFU where the device's peak is known (`measure.flops`);
- recompiles: torch's compile events after warm-up (`measure.compile_events`).

Cheap enough to leave on: on CUDA each step's end is a CUDA event (`measure.cuda.CudaStepClock`)
and real targets are counted on the device into a tensor, so no step synchronizes; both are read
when a report is asked for. The first `warmup_steps` steps, and any further ones in which torch
compiled, are warm-up and not measured, as the measuring loop warms up until nothing compiles.
Memory is sampled at most every SAMPLE_EVERY_S, from the step calls (no thread).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

import torch

from autotune.config import IGNORE_INDEX
from autotune.device import ProcessTreeMemory, describe
from autotune.device.disk import write_text_atomic
from autotune.errors import UsageError
from autotune.measure import intervals
from autotune.measure.compile_events import CompileEvents
from autotune.measure.cuda import CudaSession, session_for
from autotune.measure.flops import model_flops_utilization, step_work
from autotune.measure.loop import measured_device
from autotune.measure.peaks import memory_meter
from autotune.recipe.run_verdict import Verdict, judge

if TYPE_CHECKING:
    from autotune.model.introspect import ModelShape

FORMAT = "autotune.meter"
FORMAT_VERSION = 1
WARMUP_STEPS = 2  # at least: the first step builds the optimizer's state and the allocator's pools
MAX_WARMUP_STEPS = 50  # a run that compiles on every step is measured anyway (and its recompiles named)
SAMPLE_EVERY_S = 0.1  # memory sampling, as often as the measuring loop's sampler thread
LOW_PRECISION = ("bfloat16", "float16")  # the recipe's amp_dtype values that autocast


@dataclass
class _Counts:
    """The real targets and positions of steps: on the host when the labels are, else summed on
    the device into a tensor read only when a report asks (no synchronize per step)."""

    tokens: int = 0
    device_tokens: torch.Tensor | None = None
    positions: int = 0
    width_sum: int = 0  # the forwards' widths, summed: their mean is MFU's width
    forwards: int = 0
    work: float = 0.0

    def add(self, labels: torch.Tensor, work: float) -> None:
        real = (labels != IGNORE_INDEX).sum()
        if labels.device.type == "cpu":
            self.tokens += int(real)
        else:
            self.device_tokens = real if self.device_tokens is None else self.device_tokens + real
        self.positions += labels.numel()
        self.width_sum += int(labels.shape[-1])
        self.forwards += 1
        self.work += work

    def merge(self, other: "_Counts") -> None:
        self.tokens += other.tokens
        if other.device_tokens is not None:
            self.device_tokens = (
                other.device_tokens if self.device_tokens is None else self.device_tokens + other.device_tokens
            )
        self.positions += other.positions
        self.width_sum += other.width_sum
        self.forwards += other.forwards
        self.work += other.work

    def real_tokens(self) -> int:
        return self.tokens + (int(self.device_tokens) if self.device_tokens is not None else 0)


@dataclass
class RunFigures:
    """What a run reached, under the recipe's own names where the recipe records the figure."""

    steps: int  # measured steps, after warm-up
    warmup_steps: int
    tokens_per_sec: float | None = None
    tokens_per_sec_ci95: list[float] | None = None
    padded_tokens_per_sec: float | None = None
    padding_fraction: float | None = None
    step_time_median_s: float | None = None
    step_time_cv: float | None = None
    data_wait_fraction: float | None = None  # None: the start of each step was not seen
    mfu: float | None = None
    peak_memory_bytes: int | None = None
    peak_memory_source: str | None = None
    recompiles_during_run: int = 0
    compile_events: dict[str, int] = field(default_factory=dict)  # over the whole run, warm-up included
    autocast_seen: list[str] = field(default_factory=list)  # the dtypes the blocks' forwards ran under
    knobs_not_in_effect: list[str] = field(default_factory=list)
    device: dict[str, Any] = field(default_factory=dict)


class RunMeter:
    """Measures the training loop it is called from (see the module docstring). `recipe`: the
    `Recipe` (typed Any: recipe.py makes meters, and the layout allows no import cycle). `model`: the
    model trained (what apply_to_model returned), for the knob checks and MFU; `device`: where
    it trains (default: the model's, else CUDA when available)."""

    def __init__(
        self,
        recipe: Any,
        model: torch.nn.Module | None = None,
        *,
        device: str | torch.device | None = None,
        warmup_steps: int = WARMUP_STEPS,
        block_path: str | None = None,
    ) -> None:
        from autotune.recipe.training import unwrapped

        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 1:
            raise UsageError(f"warmup_steps must be an integer >= 1, got {warmup_steps!r}")
        self.recipe, self.warmup_steps, self.block_path = recipe, warmup_steps, block_path
        self.model = unwrapped(model)
        where = measured_device(_device_name(device, self.model))
        self.info = describe(where)
        self.session = session_for(where, self.info, None)  # no memory limit: the meter caps nothing
        self._host = ProcessTreeMemory()
        self.memory = memory_meter(self.session, self._host)
        self.memory.restart()  # this run's peak, not the process's before it
        self._sample = self.session.memory.sample if isinstance(self.session, CudaSession) else self._host.sample
        self._sampled_at = time.perf_counter()
        self.clock = self.session.clock()
        self.events = CompileEvents().__enter__()
        self.shape, self.n_params = _model_facts(self.model)
        self.autocast_seen: set[str] = set()
        self._hooks = [_watch_autocast(self.model, self.autocast_seen, block_path)] if self.model is not None else []
        self.steps = 0  # every step call, warm-up included
        self.warming = True
        self._events_seen = 0  # compile events up to the last step
        self._events_at_window = 0
        self._pending = _Counts()  # the step in progress (several forwards under accumulation)
        self.window = _Counts()
        self.work_per_step: list[float] = []
        self.waits: list[float] = []
        self._began: float | None = None
        self._ended: float | None = None

    # --- what the loop calls ------------------------------------------------------------------

    def begin(self) -> None:
        """The step's batch is in hand (a framework's step-begin hook): the time since the last
        step ended was a wait for data."""
        self._began = time.perf_counter()

    def count(self, labels: torch.Tensor) -> None:
        """The labels of one forward of the step in progress (`step(batch)` calls it; a
        framework's hook calls it where the step's batch is not handed over)."""
        if self.shape is not None and labels.dim() >= 2:
            work = step_work(self.n_params, self.shape, labels.shape[0], labels.shape[-1])
        else:  # positions alone, as the measuring loop weighs steps of a model that does not say its heads
            work = float(labels.numel())
        self._pending.add(labels, work)

    def count_forwards(self, model: torch.nn.Module) -> None:
        """Count each forward's `labels` keyword argument as the step's batch, for a framework
        whose step hooks are not handed the batch (Hugging Face Trainer calls `model(**inputs)`)."""

        def counted(module: torch.nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
            labels = kwargs.get("labels")
            if isinstance(labels, torch.Tensor):
                self.count(labels)

        self._hooks.append(model.register_forward_pre_hook(counted, with_kwargs=True))

    def step(self, batch: Any = None) -> None:
        """The end of one training step (after the optimizer's). `batch`: the step's batch, a
        dict with "labels" or an (inputs, labels) tuple; None when `count` was called for it."""
        if batch is not None:
            self.count(_labels_of(batch))
        pending, self._pending = self._pending, _Counts()
        self.steps += 1
        if self.warming:
            self._warm_up_step()
        else:
            self._measured_step(pending)
        if time.perf_counter() - self._sampled_at >= SAMPLE_EVERY_S:
            self._sample()
            self._sampled_at = time.perf_counter()
        self._ended, self._began = time.perf_counter(), None

    def batches(self, iterable: Iterable[Any]) -> Iterator[Any]:
        """`for batch in meter.batches(loader)`: each batch, timed as the measuring loop times
        next(); the step ends when the loop asks for the next batch (or stops)."""
        for batch in _timed(iter(iterable), self.begin):
            yield batch
            self.step(batch)

    # --- the steps ----------------------------------------------------------------------------

    def _warm_up_step(self) -> None:
        compiled = self.events.total > self._events_seen
        self._events_seen = self.events.total
        if (self.steps >= self.warmup_steps and not compiled) or self.steps >= MAX_WARMUP_STEPS:
            self.warming = False
            self._events_at_window = self.events.total
            self.clock.mark()  # the window starts at the end of the last warm-up step

    def _measured_step(self, pending: _Counts) -> None:
        self.clock.mark()  # on CUDA an event, released once the device has passed it
        self.window.merge(pending)
        self.work_per_step.append(pending.work)
        if self._began is not None and self._ended is not None:
            self.waits.append(self._began - self._ended)

    # --- figures ------------------------------------------------------------------------------

    def figures(self) -> RunFigures:
        """The run's figures so far. On CUDA this waits for the last step's event (the only
        synchronize the meter makes) and reads the tokens counted on the device."""
        times = self.clock.durations()
        self._sample()  # the memory now too: the last sample may be up to SAMPLE_EVERY_S old
        peak = self.memory.read()
        facts = RunFigures(
            steps=len(times),
            warmup_steps=self.steps - len(times),
            peak_memory_bytes=peak.bytes,
            peak_memory_source=peak.source,
            recompiles_during_run=0 if self.warming else self.events.total - self._events_at_window,
            compile_events=dict(self.events.by_trigger),
            autocast_seen=sorted(self.autocast_seen),
            knobs_not_in_effect=knobs_not_in_effect(self.recipe, self.model, self.autocast_seen, self.block_path),
            device=self.info.to_dict(),
        )
        wall = sum(times)
        if not times or wall <= 0:
            return facts
        tokens = self.window.real_tokens()
        rate = tokens / wall
        interval = intervals.rate_interval(rate, times, self.work_per_step)
        facts.tokens_per_sec = rate
        facts.tokens_per_sec_ci95 = list(interval) if interval else None
        facts.padded_tokens_per_sec = self.window.positions / wall
        facts.padding_fraction = 1.0 - tokens / max(self.window.positions, 1)
        facts.step_time_median_s = statistics.median(times)
        facts.step_time_cv = intervals.time_per_flop_cv(times, self.work_per_step)
        facts.data_wait_fraction = sum(self.waits) / wall if len(self.waits) == len(times) else None
        facts.mfu = self._mfu(rate)
        return facts

    def _mfu(self, rate: float) -> float | None:
        if self.shape is None or not self.window.forwards:
            return None
        return model_flops_utilization(
            rate,
            n_params=self.n_params,
            shape=self.shape,
            width=self.window.width_sum / self.window.forwards,
            device=self.info,
            amp_dtype=self.recipe.config.amp_dtype,
        )

    def report(self) -> dict[str, Any]:
        """The figures, the recipe's recorded ones beside them, and the verdict, as a dict."""
        run = asdict(self.figures())
        verdict = judge(run, self.recipe.measured, device_kind=self.info.kind)
        return {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            **run,
            "recipe": {"source": self.recipe.source, "study": self.recipe.study, "measured": self.recipe.measured},
            "verdict": asdict(verdict),
        }

    def verdict(self) -> str:
        """The verdict in one line."""
        return self.judged().line

    def judged(self) -> Verdict:
        return judge(asdict(self.figures()), self.recipe.measured, device_kind=self.info.kind)

    def save(self, path: str | Path) -> Path:
        """The report as a JSON file (`autotune verify --from` reads it)."""
        return write_text_atomic(path, json.dumps(self.report(), indent=2) + "\n", what="meter report")

    def close(self) -> None:
        """Stop watching: the compile-event callback and the model's hooks are removed."""
        self.events.__exit__(None, None, None)
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    def __enter__(self) -> "RunMeter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _timed(batches: Iterator[Any], began: Callable[[], None]) -> Iterator[Any]:
    """The batches, `began()` called the moment each one is in hand."""
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        began()
        yield batch


def _labels_of(batch: Any) -> torch.Tensor:
    if isinstance(batch, dict) and "labels" in batch:
        return batch["labels"]
    if isinstance(batch, (tuple, list)) and len(batch) >= 2 and isinstance(batch[1], torch.Tensor):
        return batch[1]  # (inputs, labels), the recipe's tuples
    raise UsageError("meter.step(batch): a dict with 'labels' or an (inputs, labels) tuple")


def _device_name(device: str | torch.device | None, model: torch.nn.Module | None) -> str:
    if device is not None:
        return str(device)
    param = next(model.parameters(), None) if model is not None else None
    if param is not None:
        return str(param.device)
    return "cuda" if torch.cuda.is_available() else "cpu"


def _model_facts(model: torch.nn.Module | None) -> tuple["ModelShape | None", int]:
    """The model's shape and non-embedding parameters, for the FLOPs of a step (MFU, the
    spread); (None, 0) for a model that does not say them."""
    from autotune.model.introspect import model_shape, non_embedding_params

    if model is None:
        return None, 0
    try:
        return model_shape(getattr(model, "_orig_mod", model)), non_embedding_params(model)
    except UsageError:
        return None, 0


def _watch_autocast(model: torch.nn.Module, seen: set[str], block_path: str | None) -> Any:
    """A forward pre-hook on the first block that notes the dtype its forward runs under: the
    recipe's autocast is entered by the loop (or the framework) around the forward, so only
    inside the model can it be seen. On the first block, not the root: accelerate enters its
    autocast inside the root's forward."""
    from autotune.model.introspect import find_blocks

    try:
        target = find_blocks(getattr(model, "_orig_mod", model), block_path)[0]
    except (UsageError, IndexError):
        target = model

    def note(module: torch.nn.Module, args: Any) -> None:
        kind = _parameter_device(module)
        seen.add(
            str(torch.get_autocast_dtype(kind)).removeprefix("torch.") if torch.is_autocast_enabled(kind) else "float32"
        )

    return target.register_forward_pre_hook(note)


def _parameter_device(module: torch.nn.Module) -> str:
    param = next(module.parameters(), None)
    return param.device.type if param is not None else "cpu"


def knobs_not_in_effect(
    recipe: Any, model: torch.nn.Module | None, autocast_seen: set[str], block_path: str | None = None
) -> list[str]:
    """The recipe's model-side knobs that the model trained does not have, one phrase each:
    checkpointed blocks and compile (the marks `apply_to_model` leaves: `knobs.checkpoint`,
    `knobs.compile`), the autocast dtype its blocks' forwards ran under, and for a Hugging Face
    model the attention implementation (SDPA, as the recipe measured)."""
    if model is None:
        return []
    cfg = recipe.config
    missing = [
        *_checkpoint_missing(cfg.checkpoint_layers, model, block_path),
        *_compile_missing(cfg, model, block_path),
        *_autocast_missing(cfg.amp_dtype, autocast_seen),
    ]
    from autotune.model.hf import attention_implementation

    attention = attention_implementation(model)
    if attention is not None and attention != "sdpa":
        missing.append(f'attention runs "{attention}", the recipe measured "sdpa" (attn_implementation="sdpa")')
    return missing


def _checkpoint_missing(layers: tuple[int, ...], model: torch.nn.Module, block_path: str | None) -> list[str]:
    from autotune.knobs.checkpoint import is_checkpointed
    from autotune.model.introspect import find_blocks

    if not layers:
        return []
    try:
        blocks = find_blocks(getattr(model, "_orig_mod", model), block_path)
    except UsageError:
        return []  # blocks not found where they usually are: pass block_path to check them
    off = [i for i in layers if i < len(blocks) and not is_checkpointed(blocks[i])]
    return [f"blocks {off} are not checkpointed (recipe.apply_to_model)"] if off else []


def _compile_missing(cfg: Any, model: torch.nn.Module, block_path: str | None) -> list[str]:
    from autotune.knobs.compile import is_compiled
    from autotune.model.introspect import find_blocks

    if cfg.compile_mode == "none" or hasattr(model, "_orig_mod") or is_compiled(model):
        return []  # compiled whole (torch.compile or Module.compile): every block is in the graph
    try:
        blocks = find_blocks(model, block_path)
    except UsageError:
        blocks = []
    if cfg.compile_scope != "model" and blocks and all(is_compiled(b) for b in blocks):
        return []
    return [f"the model is not compiled (the recipe: {cfg.compile_mode} at {cfg.compile_scope})"]


def _autocast_missing(amp_dtype: str, seen: set[str]) -> list[str]:
    if not seen:
        return []  # no forward seen yet: nothing to say
    expected = amp_dtype if amp_dtype in LOW_PRECISION else "float32"
    if seen != {expected}:
        return [f"the forward ran under {', '.join(sorted(seen))}, the recipe's is {expected} (recipe.autocast())"]
    return []
