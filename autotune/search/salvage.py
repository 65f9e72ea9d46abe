"""A search whose study stops taking writes (a full disk, the file size limit, a lock held past
the wait, a damaged file) or whose disk fails under it: what it knows becomes the best-so-far
recipe, and one line says what happened.

What it knows: the study as it still reads, or else as it read when the search started plus
each trial since (Optuna hands each finished trial to the callbacks, no read needed), plus the
trial measured last, kept in memory by the objective (`Objective.measured`): when that one could
not be stored it is in the recipe all the same, and the line says so. It stays RUNNING in the
study (see `StudyNotWritable`), so the next search measures it again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from autotune.errors import AutotuneError
from autotune.recipe.from_study import recipe_from_trial
from autotune.search.objective import StudyNotWritable
from autotune.study.record import TrialRecord, read_trials
from autotune.study.storage_errors import causes, storage_error
from autotune.study.summary import StudySummary, summarize_records
from autotune.study.urls import redact, redact_text


class Salvage:
    """The study as this search last knew it; `stopped` turns a failure into its one line."""

    def __init__(self, study: optuna.Study, name: str, url: str, recipe_path: Path) -> None:
        self.study, self.name, self.url, self.recipe_path = study, name, url, recipe_path
        self.attrs: dict[str, Any] = study.user_attrs
        self.records = {r.number: r for r in read_trials(study, self.attrs)}

    def finished(self, trial: FrozenTrial) -> None:
        """A trial of this search, as Optuna stored it (the callbacks' copy)."""
        self.records[trial.number] = TrialRecord.read(trial, self.attrs)

    def failure(self, exc: BaseException) -> AutotuneError | None:
        """The one-line error behind `exc` when a storage or a disk failed; None otherwise."""
        if isinstance(exc, StudyNotWritable):
            return exc.error
        known = storage_error(exc, self.url)
        if known is not None:
            return known
        import sqlalchemy.exc

        for cause in causes(exc):
            if isinstance(cause, sqlalchemy.exc.SQLAlchemyError):  # a database that went away, say
                first = (str(getattr(cause, "orig", None) or cause).strip().splitlines() or [type(cause).__name__])[0]
                shown = redact_text(first[:200], self.url)
                return AutotuneError(f"storage {redact(self.url)}: cannot write the study ({shown})")
            if isinstance(cause, OSError):  # a trial's temporary folder on a full disk
                where = f" {cause.filename}" if cause.filename else ""
                return AutotuneError(f"cannot write{where} ({cause.strerror or cause})")
        return None

    def stopped(self, failure: AutotuneError, measured: TrialRecord | None) -> AutotuneError:
        """The search's error: `failure`, that the search stopped, the measured trial the study could
        not store, and where the best so far was written (or why it was not)."""
        records, attrs = self._readable()
        summary, unstored = self._best_so_far(records, attrs, measured)
        said = [str(failure), "the search stopped"]
        if unstored is not None:
            said.append(
                f"trial {unstored.number} ({_figure(unstored)}) could not be stored: the study measures it again "
                "when it resumes"
            )
        said.append(self._write_recipe(summary, attrs))
        error = AutotuneError("; ".join(said))
        error.exit_code = failure.exit_code
        return error

    def _best_so_far(
        self, records: list[TrialRecord], attrs: dict[str, Any], measured: TrialRecord | None
    ) -> tuple[StudySummary, TrialRecord | None]:
        stored = next((r for r in records if measured is not None and r.number == measured.number), None)
        unstored = measured if measured is not None and (stored is None or not stored.finished) else None
        if unstored is not None:
            records = sorted([r for r in records if r.number != unstored.number] + [unstored], key=lambda r: r.number)
        return summarize_records(self.name, records, attrs), unstored

    def _readable(self) -> tuple[list[TrialRecord], dict[str, Any]]:
        """The study as it reads now (a full disk still reads), else as this search knew it."""
        try:
            attrs = self.study.user_attrs
            return read_trials(self.study, attrs), attrs
        except Exception:  # noqa: BLE001 - whatever stops the read, what the search knew stands in
            return sorted(self.records.values(), key=lambda r: r.number), self.attrs

    def _write_recipe(self, summary: StudySummary, attrs: dict[str, Any]) -> str:
        if summary.best is None:
            return f"no recipe written: {summary.no_best_reason}"
        try:
            path = recipe_from_trial(summary, self.name, self.url).save(self.recipe_path)
        except AutotuneError as exc:
            return f"no recipe written ({exc})"
        return f"the best so far (trial {summary.best.number}) is in {path}"


def _figure(trial: TrialRecord) -> str:
    return f"{trial.tokens_per_sec:,.0f} tok/s" if trial.tokens_per_sec is not None else f"value {trial.value:g}"
