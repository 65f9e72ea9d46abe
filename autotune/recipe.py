"""The recipe: the best configuration a study found, in a versioned file the user takes home.

Format `autotune.recipe` version 1 (JSON; YAML is accepted on load, safe loader only):

    format, version            "autotune.recipe", 1
    config                     every knob (TrainConfig), checkpoint_layers as explicit indices
    model                      name, seq_len, n_layer, vocab_size, non_embedding_params
    data                       the data spec it was measured on (synthetic or a file name)
    measured                   tokens_per_sec, padded_tokens_per_sec, padding_fraction,
                               step_time_median_s, step_time_cv, mfu, peak_memory_bytes,
                               peak_memory_source, memory_limit_bytes, data_wait_fraction,
                               compile_time_s, gpu_utilization
    reference_speedups         {"baseline": x, "checklist": y} (best over each reference trial)
    hardware                   the DeviceInfo of the device it was measured on
    software                   torch, optuna, autotune, python versions
    study                      name, storage (password redacted), trial number
    created                    ISO 8601 time
"""

from __future__ import annotations

import datetime as _dt
import json
import platform
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from autotune import __version__
from autotune.config import TrainConfig
from autotune.errors import UsageError

FORMAT = "autotune.recipe"
FORMAT_VERSION = 1
_KEYS = {"format", "version", "config", "model", "data", "measured", "reference_speedups", "hardware",
         "software", "study", "created"}


@dataclass
class Recipe:
    config: TrainConfig
    model: dict[str, Any] = field(default_factory=dict)
    data: str = "synthetic"
    measured: dict[str, Any] = field(default_factory=dict)
    reference_speedups: dict[str, float | None] = field(default_factory=dict)
    hardware: dict[str, Any] = field(default_factory=dict)
    software: dict[str, Any] = field(default_factory=dict)
    study: dict[str, Any] = field(default_factory=dict)
    created: str = ""

    # --- files -----------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["config"] = self.config.to_dict()
        return {"format": FORMAT, "version": FORMAT_VERSION, **data}

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")
        tmp.replace(path)  # atomic: a kill never leaves half a recipe
        return path

    @classmethod
    def load(cls, path: str | Path, *, check_environment: bool = True) -> "Recipe":
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"recipe {path}: cannot read it ({exc.strerror})") from None
        try:
            # safe_load parses JSON too, and refuses !!python/object and every other tag
            # that would construct objects: nothing in a recipe file is ever executed.
            raw = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise UsageError(f"recipe {path}: not a valid recipe file ({str(exc).splitlines()[0]})") from None
        recipe = cls.from_dict(raw, where=f"recipe {path}")
        if check_environment:
            recipe.warn_if_elsewhere()
        return recipe

    @classmethod
    def from_dict(cls, raw: Any, *, where: str = "recipe") -> "Recipe":
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise UsageError(f"{where}: not an autotune recipe (expected format: {FORMAT})")
        version = raw.get("version")
        if not isinstance(version, int) or version < 1:
            raise UsageError(f"{where}: version must be a positive integer, got {version!r}")
        if version > FORMAT_VERSION:
            raise UsageError(f"{where}: format version {version} is newer than this autotune reads "
                             f"({FORMAT_VERSION}); upgrade autotune")
        unknown = sorted(set(raw) - _KEYS)
        if unknown:
            raise UsageError(f"{where}: unknown key {unknown[0]!r}")
        if not isinstance(raw.get("config"), dict):
            raise UsageError(f"{where}: config must be a mapping of knobs")
        for key in ("model", "measured", "reference_speedups", "hardware", "software", "study"):
            if not isinstance(raw.get(key, {}), dict):
                raise UsageError(f"{where}: {key} must be a mapping")
        config = TrainConfig.from_dict(raw["config"], where=f"{where}: config")
        return cls(config=config, model=raw.get("model", {}), data=str(raw.get("data", "synthetic")),
                   measured=raw.get("measured", {}), reference_speedups=raw.get("reference_speedups", {}),
                   hardware=raw.get("hardware", {}), software=raw.get("software", {}),
                   study=raw.get("study", {}), created=str(raw.get("created", "")))

    # --- provenance --------------------------------------------------------------------------

    def differences_from_here(self, device: str | None = None) -> list[str]:
        """What differs between where the recipe was measured and this environment."""
        import torch

        from autotune.device import describe, resolve_device

        diffs = []
        if self.software.get("torch") and self.software["torch"] != torch.__version__:
            diffs.append(f"torch {self.software['torch']} there, {torch.__version__} here")
        try:
            here = describe(resolve_device(device or ("cuda" if self.hardware.get("kind") == "cuda" else "cpu")))
        except UsageError:
            here = None
        there = self.hardware.get("name")
        if there and (here is None or here.name != there):
            diffs.append(f"measured on {there}, running on {here.name if here else 'no such device'}")
        return diffs

    def warn_if_elsewhere(self, device: str | None = None) -> None:
        diffs = self.differences_from_here(device)
        if diffs:
            warnings.warn("this recipe was measured elsewhere: " + "; ".join(diffs), RecipeEnvironmentWarning, stacklevel=3)


class RecipeEnvironmentWarning(UserWarning):
    """The recipe was measured on other hardware or another torch version."""


def software_versions() -> dict[str, str]:
    import optuna
    import torch

    return {"torch": torch.__version__, "optuna": optuna.__version__, "autotune": __version__,
            "python": platform.python_version()}


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def recipe_measured(measurement: Mapping[str, Any], memory_limit_bytes: int | None) -> dict[str, Any]:
    keys = ("tokens_per_sec", "padded_tokens_per_sec", "padding_fraction", "step_time_median_s", "step_time_cv",
            "mfu", "peak_memory_bytes", "peak_memory_source", "allocator_peak_bytes", "data_wait_fraction",
            "compile_time_s", "gpu_utilization")
    out = {k: measurement.get(k) for k in keys}
    out["memory_limit_bytes"] = memory_limit_bytes
    return out
