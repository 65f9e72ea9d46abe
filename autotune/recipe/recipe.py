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

In a training script (the recipe applies itself; see `Recipe.dataloader` for the dataset contract):

    recipe = autotune.Recipe.load("recipes/gpt2-nvidia-h200.json")
    model = recipe.apply_to_model(model)        # TF32 if chosen; checkpoint the chosen blocks, then compile
    loader = recipe.dataloader(dataset)         # workers, prefetch, pinning, token-budget batches
    scaler = recipe.grad_scaler()               # enabled only for float16
    for input_ids, labels in loader:
        with recipe.autocast():                 # the AMP dtype and the forced SDPA backend
            loss = model(input_ids.to(device), labels.to(device))
        scaler.scale(loss).backward(); scaler.step(optimizer); scaler.update(); optimizer.zero_grad()

Importing this module does not import torch; the training-side methods do, when called.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import yaml

from autotune.config import TrainConfig
from autotune.errors import RecipeEnvironmentWarning, UsageError
from autotune.measure.measurement import Measurement

if TYPE_CHECKING:  # torch is imported by the methods that need it, not by `import autotune`
    import contextlib

    import torch
    from torch.utils.data import DataLoader

FORMAT = "autotune.recipe"
FORMAT_VERSION = 1
_KEYS = {
    "format",
    "version",
    "config",
    "model",
    "data",
    "measured",
    "reference_speedups",
    "hardware",
    "software",
    "study",
    "created",
}


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
        # Through JSON: plain types only (torch.__version__ is a str subclass that
        # yaml.safe_dump refuses; tuples become lists), whatever the fields were built from.
        return json.loads(json.dumps({"format": FORMAT, "version": FORMAT_VERSION, **data}))

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        # A name of its own per process: workers of one study may write the same recipe at once.
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
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
            raise UsageError(
                f"{where}: format version {version} is newer than this autotune reads "
                f"({FORMAT_VERSION}); upgrade autotune"
            )
        unknown = sorted(set(raw) - _KEYS)
        if unknown:
            raise UsageError(f"{where}: unknown key {unknown[0]!r}")
        if not isinstance(raw.get("config"), dict):
            raise UsageError(f"{where}: config must be a mapping of knobs")
        for key in ("model", "measured", "reference_speedups", "hardware", "software", "study"):
            if not isinstance(raw.get(key, {}), dict):
                raise UsageError(f"{where}: {key} must be a mapping")
        config = TrainConfig.from_dict(raw["config"], where=f"{where}: config")
        return cls(
            config=config,
            model=raw.get("model", {}),
            data=str(raw.get("data", "synthetic")),
            measured=raw.get("measured", {}),
            reference_speedups=raw.get("reference_speedups", {}),
            hardware=raw.get("hardware", {}),
            software=raw.get("software", {}),
            study=raw.get("study", {}),
            created=str(raw.get("created", "")),
        )

    # --- in a training script -------------------------------------------------------------

    def apply_to_model(
        self, model: "torch.nn.Module", block_path: str | None = None, device: "str | torch.device | None" = None
    ) -> "torch.nn.Module":
        """Apply the model-side knobs to `model`, in place, and return it: activation
        checkpointing of the recipe's blocks, then per-block torch.compile (the one order,
        see `autotune.knobs`). A tf32 recipe also turns TF32 on here, process-wide, as it was
        measured: for the whole step (forward, backward, optimizer and the kernels compile
        generates), not just inside `autocast()`. Works on any model whose blocks sit in one ModuleList at
        transformer.h, model.layers, layers, blocks (and a few more), or at `block_path`
        ("stack", "encoder.layer"). A block index beyond the model's count is a UsageError:
        the recipe was made for a deeper model. `device`: move the model there first, so
        compile sees the parameters where they will live. State-dict keys do not change."""
        from autotune.knobs.apply import apply_model_knobs
        from autotune.knobs.precision import set_tf32

        if self.config.amp_dtype == "tf32":
            set_tf32(True)
        if device is not None:
            model.to(device)
        return apply_model_knobs(model, self.config, block_path)

    def dataloader(
        self,
        dataset: Any,
        *,
        collate_fn: Callable[[list["torch.Tensor"]], Any] | None = None,
        seq_len: int | None = None,
        seed: int = 0,
    ) -> "DataLoader":
        """A DataLoader of `(input_ids, labels)` batches with the recipe's workers, prefetch,
        pinning, persistent workers, token budget and batching mode.

        Dataset contract: map-style (`len(dataset)`, `dataset[i]`), item i one whole
        training sequence of token ids, as a list, a NumPy array or a 1-D tensor, with
        2 <= len <= seq_len + 1. The model reads inputs x[:-1] and labels x[1:]; batches are
        right-padded, inputs with 0 and labels with -100 (ignored by cross-entropy).
        Batching: "padded" groups sequences of similar length into batches of at most
        token_budget tokens (padding included); "fixed" takes token_budget // seq_len
        sequences padded to seq_len; "packed" concatenates and cuts windows of seq_len + 1.

        Lengths: when the dataset has a `lengths` attribute (lengths[i] == len(dataset[i]),
        or an upper bound of it) batches are planned from it without reading the data.
        Without one, every item is read once, here, in this process, to learn its length:
        one full pass over the dataset (tokenization included, if __getitem__ tokenizes),
        before training starts. Give large datasets a `lengths` attribute.

        seq_len: the recipe's (model["seq_len"]), else the longest item - 1.
        collate_fn: replaces the padding collate; it receives the list of 1-D int64 tensors.
        pin_memory on a machine without CUDA is dropped, with one warning."""
        from autotune.recipe.training import recipe_dataloader

        return recipe_dataloader(
            self.config,
            dataset,
            collate_fn=collate_fn,
            seq_len=seq_len,
            recorded_seq_len=self.model.get("seq_len"),
            seed=seed,
        )

    def autocast(self, device_type: str | None = None) -> "contextlib.AbstractContextManager[None]":
        """What each forward pass runs under: autocast to the recipe's AMP dtype and the forced
        SDPA backend. A tf32 recipe turns TF32 on for the process here too (as
        `apply_to_model` does), and leaves it on when the block ends: the backward pass and
        the optimizer step that follow it are two thirds of the step's matmuls.
        device_type: "cuda" when CUDA is available, else "cpu"."""
        from autotune.knobs.precision import set_tf32, training_context
        from autotune.recipe.training import device_kind

        if self.config.amp_dtype == "tf32":
            set_tf32(True)
        return training_context(device_kind(device_type), self.config)

    def grad_scaler(self, device_type: str | None = None) -> "torch.amp.GradScaler":
        """A GradScaler enabled only for float16 (a disabled one is a no-op), so the
        training step is the same code whatever the dtype."""
        from autotune.knobs.precision import grad_scaler
        from autotune.recipe.training import device_kind

        return grad_scaler(device_kind(device_type), self.config.amp_dtype)

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
            warnings.warn(
                "this recipe was measured elsewhere: " + "; ".join(diffs), RecipeEnvironmentWarning, stacklevel=3
            )


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


RECIPE_FIGURES = (
    "tokens_per_sec",
    "padded_tokens_per_sec",
    "padding_fraction",
    "step_time_median_s",
    "step_time_cv",
    "mfu",
    "peak_memory_bytes",
    "peak_memory_source",
    "allocator_peak_bytes",
    "data_wait_fraction",
    "compile_time_s",
    "gpu_utilization",
)


def recipe_measured(measurement: Measurement | None, memory_limit_bytes: int | None) -> dict[str, Any]:
    """The figures a recipe records (its `measured` section) from a run's Measurement."""
    out = {k: getattr(measurement, k) if measurement is not None else None for k in RECIPE_FIGURES}
    out["memory_limit_bytes"] = memory_limit_bytes
    return out
