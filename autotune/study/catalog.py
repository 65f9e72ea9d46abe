"""The studies a storage holds, or the studies under `studies/` (where `search` writes them by
default): what `autotune show` lists when no study is named. Reads only; no torch."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import optuna

from autotune.errors import UsageError
from autotune.study.storage import open_storage, study_names
from autotune.study.summary import summarize
from autotune.study.urls import STUDIES_DIR, redact


@dataclass(frozen=True)
class StudyEntry:
    name: str
    storage: str  # redacted URL
    model: str | None
    device: str | None
    trials: int
    best_tokens_per_sec: float | None
    default_storage: bool  # `autotune show --study NAME` finds it without --storage


def default_storages(directory: Path = STUDIES_DIR) -> list[str]:
    """The storage URLs `search` writes by default: studies/*.db, and journals beside them."""
    if not directory.is_dir():
        return []
    urls = [f"sqlite:///{p}" for p in sorted(directory.glob("*.db"))]
    return urls + [f"journal:{p}" for p in sorted(directory.glob("*.journal"))]


def list_studies(storage_url: str | None = None, directory: Path = STUDIES_DIR) -> list[StudyEntry]:
    """Every study in `storage_url`, or in the default storages under `directory`."""
    urls = [storage_url] if storage_url else default_storages(directory)
    entries = []
    for url in urls:
        storage = open_storage(url, create=False)
        for name in study_names(storage):
            study = optuna.load_study(study_name=name, storage=storage)
            summary = summarize(study)
            entries.append(
                StudyEntry(
                    name=name,
                    storage=redact(url),
                    model=summary.about.model,
                    device=summary.about.hardware.get("name"),
                    trials=len(summary.trials),
                    best_tokens_per_sec=summary.best.figure if summary.best is not None else None,
                    default_storage=storage_url is None and url == f"sqlite:///{directory / (name + '.db')}",
                )
            )
    if not entries:
        where = redact(storage_url) if storage_url else f"{directory}/ (no *.db or *.journal there)"
        raise UsageError(f"no study found in {where}: run `autotune search` first, or give --storage")
    return entries
