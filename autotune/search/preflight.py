"""Everything a search needs, checked before anything is written or run, in one pass that
descends: the task's options, the device, the objective, the trial timeout, the memory limit and
headroom (`Basics`), then the task's own parts (the model, data, space or workload: its
`resolve`), then where the study and the recipe go (the storage URL, its folder, the disks) and a
warm start's source. The result is typed (`Preflight`): what the search opens. A refused run has
created nothing."""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from autotune.config import check_int
from autotune.device import DeviceInfo, describe, resolve_device, total_host_memory
from autotune.device.disk import check_writable
from autotune.errors import UsageError
from autotune.measure import outcomes
from autotune.search.generate import GenerateTask
from autotune.search.settings import SearchSettings
from autotune.search.task import Basics, Task
from autotune.search.training import TrainTask
from autotune.study.leaders import DEFAULT_OBJECTIVE
from autotune.study.storage import check_storage_writable, open_storage, study_names
from autotune.study.urls import STUDIES_DIR, check_study_name, default_storage_url, parse_storage_url
from autotune.trial import folders
from autotune.units import MIN_MEMORY_SIZE, check_memory_fraction, format_bytes

if TYPE_CHECKING:
    from autotune.search.warm_start import WarmStart

log = logging.getLogger(__name__)

TASKS: dict[str, type[TrainTask] | type[GenerateTask]] = {TrainTask.name: TrainTask, GenerateTask.name: GenerateTask}
DEFAULT_MEMORY_FRACTION = 0.9
DEFAULT_TRIAL_TIMEOUT_S = {"cpu": 300.0, "cuda": 600.0}
MAX_MEMORY_HEADROOM = 0.5  # more would judge a configuration on under half the memory it may use


@dataclass(frozen=True)
class Preflight:
    """A search, checked: what it runs (its task), and where its study and recipe go."""

    task: Task
    name: str  # the study's
    url: str  # its storage
    recipe_path: Path
    warm: "WarmStart | None" = None  # the trials a new study starts from


def preflight(settings: SearchSettings) -> Preflight:
    """Check everything before anything is written (see the module's docstring)."""
    from autotune.model.load import check_model_name

    task_type = check_task_options(settings)
    task_type.check_options(settings)  # what needs nothing resolved (a bad --fix), at once
    if ":" not in settings.model:
        check_model_name(settings.model)  # a name of ours, or UsageError; imports nothing
    device_name = resolve_device(settings.device)
    device = describe(device_name)
    basics = Basics(
        device_name,
        device,
        _objective(settings.objective or DEFAULT_OBJECTIVE, device),
        _trial_timeout(settings, device.kind),
        memory_limit(settings, device),
        memory_headroom(settings),
    )
    task = task_type.resolve(settings, basics)
    name, url = study_location(settings, task.default_study_name(settings.model))
    warm = None
    if settings.warm_start_from:
        from autotune.search.warm_start import plan_warm_start

        warm = plan_warm_start(settings.warm_start_from, task)  # reads the source; refusals leave nothing
    return Preflight(task, name, url, recipe_path(settings, name), warm)


def check_task_options(settings: SearchSettings) -> type[TrainTask] | type[GenerateTask]:
    """The task asked for; an option of another task, or an objective it has not, refused in one
    line (it would be silently ignored otherwise)."""
    task = TASKS[settings.task]
    defaults = {name: default for name, _, default in SearchSettings.options()}
    flags = {name: option.flag for name, option, _ in SearchSettings.options()}
    for other in TASKS.values():
        foreign = [name for name in other.options if name not in task.options]
        given = [name for name in foreign if getattr(settings, name) != defaults[name]]
        if given:
            needs = "--task train (the default)" if other is TrainTask else f"--task {other.name}"
            raise UsageError(f"{flags[given[0]]} is an option of {needs}")
    if settings.objective is not None and settings.objective not in task.objectives:
        raise UsageError(
            f"--objective {settings.objective} is not one of --task {task.name}: {' or '.join(task.objectives)}"
        )
    return task


def _objective(objective: str, device: DeviceInfo) -> str:
    """The study's objective; tokens_per_joule only where this device has an energy counter."""
    if objective == "tokens_per_joule":
        from autotune.measure.energy import energy_meter

        meter = energy_meter(device.kind, device.uuid)
        if not meter.available:
            raise UsageError(
                f"--objective tokens_per_joule needs an energy counter, and {device.name} has none: {meter.note}"
            )
    return objective


def memory_limit(settings: SearchSettings, device: DeviceInfo) -> int:
    """--memory-limit, else --memory-fraction (default 0.9) of the device total: NVML's
    total on a GPU, the host's RAM on CPU (where the limit applies to the run's process tree)."""
    if settings.memory_limit_bytes is not None:
        check_int("the memory limit", settings.memory_limit_bytes, minimum=1)
        return settings.memory_limit_bytes
    fraction = DEFAULT_MEMORY_FRACTION
    if settings.memory_fraction is not None:
        fraction = check_memory_fraction(settings.memory_fraction)
    total = device.total_memory_bytes if device.kind == "cuda" else total_host_memory()
    if not total:
        raise UsageError("the device's total memory is unknown (no NVML): give --memory-limit")
    limit = int(fraction * total)
    if limit < MIN_MEMORY_SIZE:
        raise UsageError(
            f"--memory-fraction {fraction:g} of {format_bytes(total)} is {format_bytes(limit)}; "
            "a memory limit must be at least 1 MiB"
        )
    return limit


def memory_headroom(settings: SearchSettings) -> float:
    """--memory-headroom, else the default (see outcomes.DEFAULT_MEMORY_HEADROOM)."""
    headroom = settings.memory_headroom
    if headroom is None:
        return outcomes.DEFAULT_MEMORY_HEADROOM
    if not 0 <= headroom <= MAX_MEMORY_HEADROOM:
        raise UsageError(f"--memory-headroom must be from 0% to {MAX_MEMORY_HEADROOM:.0%}, got {headroom:g}")
    return headroom


def _trial_timeout(settings: SearchSettings, kind: str) -> float:
    timeout = settings.trial_timeout_s
    if timeout is None:
        return DEFAULT_TRIAL_TIMEOUT_S["cpu" if kind == "cpu" else "cuda"]
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < float("inf"):
        raise UsageError(f"--trial-timeout must be a positive number of seconds, got {timeout!r}")
    return float(timeout)


# --- where it writes --------------------------------------------------------------------------


def study_location(settings: SearchSettings, default_name: str) -> tuple[str, str]:
    """The study's name and storage URL, every place it writes checked writable (the storage,
    the recipe, the trials' temporary folders); a killed tuner's trial folders removed."""
    name = check_study_name(settings.study) if settings.study is not None else default_name
    if settings.storage:
        parse_storage_url(settings.storage)  # a malformed URL is refused before anything else
    if settings.new_study:
        name = next_free_study_name(name, settings.storage)
    url = settings.storage or default_storage_url(name)
    check_storage_writable(url)
    check_writable(recipe_path(settings, name), what="recipe", create_folders=True)
    # Each trial's request, result and stderr go to a temporary folder; a killed tuner's stay.
    check_writable(Path(tempfile.gettempdir()) / "autotune-trial-check", what="temporary folder for trials")
    for path in folders.remove_orphaned_folders():
        log.info("removed %s (a trial folder of a tuner that was killed)", path)
    return name, url


def recipe_path(settings: SearchSettings, name: str) -> Path:
    return Path(settings.recipe) if settings.recipe else Path("recipes") / f"{name}.json"


def next_free_study_name(name: str, storage: str | None) -> str:
    """`name`, or NAME-2, NAME-3, ... : the first that names no study yet (in `storage`, or,
    with the default storage, no studies/NAME.db file). Reads only."""
    taken: set[str] = set()
    if storage is not None:
        parsed = parse_storage_url(storage)
        if parsed.path is None or parsed.path.exists():
            if not parsed.in_memory:
                taken = set(study_names(open_storage(storage, create=False)))
    for n in range(1, 10_000):
        candidate = name if n == 1 else f"{name}-{n}"
        exists = candidate in taken if storage is not None else (STUDIES_DIR / f"{candidate}.db").exists()
        if not exists:
            if candidate != name:
                log.warning("starting a new study, %s (%s exists)", candidate, name)
            return candidate
    raise UsageError(f"--new-study: no free name {name}-N left")
