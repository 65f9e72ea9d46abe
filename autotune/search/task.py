"""What a search is, whatever it tunes: a task, the resolved and checked context of one study
(the preflight's result: `search.preflight`), and everything that differs between tasks behind the
one interface `Task` declares, which the one search path calls (`search.run`, `search.objective`,
`search.confirm`). The tasks: `search.training.TrainTask` and `search.generate.GenerateTask`; a
third is one more subclass and one more entry in `search.preflight.TASKS`. `resume` applies the
rules (`Task.rules`) a resumed study keeps. Torch-free: the tuner process never imports torch."""

from __future__ import annotations

import dataclasses
import logging
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar

import optuna

from autotune.device import DeviceInfo
from autotune.device.info import software_versions
from autotune.errors import UsageError
from autotune.knobs.support import DeviceCapabilities
from autotune.measure import outcomes
from autotune.study import leaders
from autotune.study.study_record import RunRules, StudyRecord
from autotune.units import format_bytes

if TYPE_CHECKING:
    from autotune.search.settings import SearchSettings
    from autotune.trial.runner import TrialResult

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Basics:
    """What every task's study is measured under, resolved and checked."""

    device_name: str  # resolved: cpu, cuda:0
    device: DeviceInfo
    objective: str
    trial_timeout_s: float
    memory_limit_bytes: int
    memory_headroom: float

    def fields(self) -> dict[str, Any]:
        """The `Task` fields these give (all but the device's name)."""
        return {k: v for k, v in vars(self).items() if k != "device_name"}


@dataclass(frozen=True)
class Rule:
    """One thing every trial of a study was measured under. A resumed study keeps its value:
    taken from the study when the run does not ask for one (`adopt`), a refusal when it asks for
    another (or when the value cannot be taken: `adopt` None)."""

    label: str  # as the refusal names it: "--steps", "memory limit"
    stored: Any  # the study's value
    asked: Any  # this run's
    given: bool  # the run asked for its value
    adopt: Callable[[Any], dict[str, Any]] | None = None  # the task's fields that take the study's value
    shown: Callable[[Any], str] = str

    def differs(self) -> bool:
        return self.stored != self.asked


@dataclass(frozen=True, kw_only=True)
class Task:
    """The fields every task's study shares; a task adds its spec, space and workload."""

    name: ClassVar[str]
    objectives: ClassVar[tuple[str, ...]]  # what a study of it may maximize (--objective)
    options: ClassVar[tuple[str, ...]]  # the SearchSettings fields only this task takes
    config_type: ClassVar[type]  # its configuration: config.TrainConfig, config.GenerateConfig
    predicts_memory: ClassVar[bool] = False  # search.memory_model may skip a configuration sure not to fit
    spec: Any  # what every trial runs with (config.RunSpec, config.GenerateSpec)
    device: DeviceInfo
    memory_limit_bytes: int
    trial_timeout_s: float
    # Feasible only with a worst-case peak <= limit x (1 - headroom) (outcomes.memory_constraint)
    memory_headroom: float = outcomes.DEFAULT_MEMORY_HEADROOM
    objective: str = leaders.DEFAULT_OBJECTIVE

    def __post_init__(self) -> None:
        # The run judges memory itself (outcomes.decide_*): it gets the study's limit and headroom.
        spec = dataclasses.replace(
            self.spec, memory_headroom=self.memory_headroom, memory_limit_bytes=self.memory_limit_bytes
        )
        object.__setattr__(self, "spec", spec)

    @property
    def capabilities(self) -> DeviceCapabilities:
        return DeviceCapabilities.detect(self.device.kind, self.device.capability_tuple)

    @property
    def ranks(self) -> int:
        return 1

    @classmethod
    def check_options(cls, settings: "SearchSettings") -> None:
        """What can be refused before anything is resolved (a malformed option), at once."""

    @classmethod
    def resolve(cls, settings: "SearchSettings", basics: "Basics") -> "Task":
        """The task's study context from the settings and what every study shares, checked."""
        raise NotImplementedError

    def default_study_name(self, model: str) -> str:
        """The study a search writes without --study."""
        raise NotImplementedError

    # --- the study --------------------------------------------------------------------------

    def identity(self) -> dict[str, Any]:
        raise NotImplementedError

    def record(self) -> StudyRecord:
        """What a new study of this task is given (its attrs: `StudyRecord.attrs`)."""
        raise NotImplementedError

    def _record(self, space: Any, **own: Any) -> StudyRecord:
        """The record's fields every task shares, and the task's `own`."""
        spec = self.spec
        run = RunRules(spec.warmup, spec.steps, spec.min_time_s, spec.seed, own.pop("global_batch_tokens", None))
        return StudyRecord(
            task=self.name,
            model=spec.model,
            hardware=self.device.to_dict(),
            software=software_versions(),
            memory_limit_bytes=self.memory_limit_bytes,
            memory_headroom=self.memory_headroom,
            objective=self.objective,
            run=replace(run, nproc_per_node=self.ranks),
            space=space.to_dict(),
            space_hash=space.hash,
            identity=self.identity(),
            **own,
        )

    def sampler(self, seed: int | None) -> optuna.samplers.BaseSampler:
        raise NotImplementedError

    # --- a trial ----------------------------------------------------------------------------

    def configure(self, trial: optuna.Trial, reference: str | None) -> Any:
        """The trial's configuration; UsageError when the sampler's knobs are refused together."""
        raise NotImplementedError

    def refusal(self, cfg: Any) -> str | None:
        """Why `cfg` cannot run here, known before any process starts; None when it can."""
        raise NotImplementedError

    def measure(
        self,
        cfg: Any,
        *,
        on_start: Callable[[int], None] | None = None,
        prune_below: float | None = None,
        env: dict[str, str] | None = None,
    ) -> "TrialResult":
        raise NotImplementedError

    def constraints(self, result: "TrialResult") -> dict[str, float]:
        """A measured trial's constraints besides memory (each feasible when <= 0)."""
        return {}

    # --- resuming ---------------------------------------------------------------------------

    def rules(self, attrs: dict[str, Any], settings: "SearchSettings") -> list[Rule]:
        """What a study of this task keeps when resumed: the memory limit and headroom, the timed
        window; a task adds its own."""
        stored = StudyRecord.read(attrs)
        stored_limit = stored.memory_limit_bytes
        rules = [
            Rule(
                "memory limit",
                stored_limit if stored_limit is not None else self.memory_limit_bytes,
                self.memory_limit_bytes,
                settings.limit_given,
                lambda v: {"memory_limit_bytes": v},
                lambda v: f"{format_bytes(v)} ({v} bytes)" if v == stored_limit else format_bytes(v),
            ),
            Rule(
                "--memory-headroom",
                stored.headroom,
                self.memory_headroom,
                settings.memory_headroom is not None,
                lambda v: {"memory_headroom": v},
                lambda v: f"{v:.0%}",
            ),
        ]
        for key, option in (("steps", "--steps"), ("min_time_s", "--min-time")):
            if getattr(stored.run, key) is not None:
                rules.append(
                    Rule(option, getattr(stored.run, key), getattr(self.spec, key), True, None, lambda v: f"{v:g}")
                )
        return rules


def model_slug(model: str) -> str:
    """The model part of a default study name: `gpt2`, `hf-gpt2`, `hf-<directory name>` for a
    local config directory, `pkg.mod-factory` for a factory (with its module, so that two
    modules' `factory` functions do not share a study)."""
    if model.startswith("hf:"):
        spec = model[len("hf:") :]
        name = "hf-" + (Path(spec).name or spec if ("/" in spec or spec.startswith(".")) else spec)
    else:
        name = model.replace(":", "-")
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip(".-") or "model"


def resume(study: optuna.Study, task: Task, settings: "SearchSettings") -> Task:
    """The task to resume `study` with: the study's own objective and rules where the run sets
    none; UsageError naming every rule the run asks to change (trials measured under other rules
    cannot be compared)."""
    attrs = study.user_attrs
    stored_objective = StudyRecord.read(attrs).objective
    if stored_objective != task.objective:
        if settings.objective is not None:
            raise UsageError(
                f"study {study.study_name!r} maximizes {stored_objective}, this run asks for {task.objective}: "
                "resume it with its objective, or start a new study (--new-study, or --study NAME)"
            )
        task = dataclasses.replace(task, objective=stored_objective)
    differences, changes = [], {}
    for rule in task.rules(attrs, settings):
        if not rule.differs():
            continue
        if rule.given or rule.adopt is None:
            differences.append(f"{rule.label} {rule.shown(rule.stored)}, this run {rule.shown(rule.asked)}")
        else:
            log.info("resuming %r with its %s %s", study.study_name, rule.label.lstrip("-"), rule.shown(rule.stored))
            changes.update(rule.adopt(rule.stored))
    if differences:
        raise UsageError(
            f"study {study.study_name!r} was measured with {'; '.join(differences)}: trials measured under other "
            "rules cannot be compared. Resume it with its settings, or start a new study (--new-study, or "
            "--study NAME)"
        )
    return dataclasses.replace(task, **changes) if changes else task
