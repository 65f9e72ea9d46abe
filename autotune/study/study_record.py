"""A study as a typed record, beside `TrialRecord`: what a study was made for and the rules every
trial of it was measured under. Written once, when the study is made (`StudyRecord.attrs`, from
its task: `search.task`), and read in one place (`StudyRecord.read`), so no reader spells a
study attr's name or guesses its default.

A study's user attrs are its record on disk, as plain JSON (optuna-dashboard shows them). A study
made before a field existed reads with the value it was measured under: no task is training, no
objective is tokens/s, no headroom is 0 (its trials were judged against the limit itself), no
ranks is one. A field of the wrong type (a hand-edited study) reads as absent. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from autotune import registry

DEFAULT_OBJECTIVE = "tokens_per_sec"  # study.leaders', which reads its records through this module


def _typed(value: Any, kind: type | tuple[type, ...]) -> Any:
    return value if isinstance(value, kind) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class RunRules:
    """The timed window and the batch every trial was measured with (the study's "run" attr)."""

    warmup: int | None = None
    steps: int | None = None
    min_time_s: float | None = None
    seed: int | None = None
    global_batch_tokens: int | None = None  # None: one micro-batch per optimizer step
    nproc_per_node: int = 1  # ranks a trial

    @classmethod
    def read(cls, data: Any) -> "RunRules":
        data = data if isinstance(data, Mapping) else {}
        return cls(
            _typed(data.get("warmup"), int),
            _typed(data.get("steps"), int),
            _typed(data.get("min_time_s"), (int, float)),
            _typed(data.get("seed"), int),
            _typed(data.get("global_batch_tokens"), int),
            _typed(data.get("nproc_per_node"), int) or 1,
        )

    def to_dict(self) -> dict[str, Any]:
        out = {"warmup": self.warmup, "steps": self.steps, "min_time_s": self.min_time_s, "seed": self.seed}
        out["global_batch_tokens"] = self.global_batch_tokens
        if self.nproc_per_node > 1:  # a study of one rank reads as it always has
            out["nproc_per_node"] = self.nproc_per_node
        return out


@dataclass(frozen=True)
class StudyRecord:
    """What a study is: its task, model, hardware and rules."""

    task: str = registry.TRAIN
    model: str | None = None
    hardware: dict[str, Any] = field(default_factory=dict)  # device.info.DeviceInfo.to_dict()
    software: dict[str, Any] = field(default_factory=dict)  # versions of torch, optuna, ... that made it
    memory_limit_bytes: int | None = None
    memory_headroom: float | None = None  # None: a study made before headrooms (read as 0)
    objective: str = DEFAULT_OBJECTIVE
    run: RunRules = field(default_factory=RunRules)
    space: dict[str, Any] | None = None
    space_hash: str | None = None
    identity: dict[str, Any] | None = None  # what a resumed study must match (`study.lifecycle`)
    # training's
    data: str | None = None
    seq_len: int | None = None
    n_layer: int | None = None
    space_source: str | None = None
    # generation's
    workload: dict[str, Any] | None = None
    bounds: dict[str, float | None] | None = None

    @property
    def headroom(self) -> float:
        return self.memory_headroom if self.memory_headroom is not None else 0.0

    @classmethod
    def read(cls, attrs: Mapping[str, Any]) -> "StudyRecord":
        made = attrs.get("autotune")
        software = made.get("software") if isinstance(made, Mapping) else None
        return cls(
            task=_typed(attrs.get("task"), str) or registry.TRAIN,
            model=_typed(attrs.get("model"), str),
            hardware=_typed(attrs.get("hardware"), dict) or {},
            software=_typed(software, dict) or {},
            memory_limit_bytes=_typed(attrs.get("memory_limit_bytes"), int),
            memory_headroom=_typed(attrs.get("memory_headroom"), (int, float)),
            objective=_typed(attrs.get("objective"), str) or DEFAULT_OBJECTIVE,
            run=RunRules.read(attrs.get("run")),
            space=_typed(attrs.get("space"), dict),
            space_hash=_typed(attrs.get("space_hash"), str),
            identity=_typed(attrs.get("identity"), dict),
            data=_typed(attrs.get("data"), str),
            seq_len=_typed(attrs.get("seq_len"), int),
            n_layer=_typed(attrs.get("n_layer"), int),
            space_source=_typed(attrs.get("space_source"), str),
            workload=_typed(attrs.get("workload"), dict),
            bounds=_typed(attrs.get("bounds"), dict),
        )

    def attrs(self) -> dict[str, Any]:
        """The study's user attrs (the identity among them): every field that is set."""
        out: dict[str, Any] = {"autotune": {"kind": "search", "software": self.software}}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if name == "run":
                out["run"] = value.to_dict()
            elif name != "software" and value is not None:
                out[name] = value
        return out
