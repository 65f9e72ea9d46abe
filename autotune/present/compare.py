"""Studies side by side: what was best on each device, what mattered, and how one
device's best did on another (REFs name studies; see `study.storage`).

Everything here returns data or text; the CLI prints it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import optuna

from autotune.config import GENERATE_KNOBS, KNOBS, normalize_config_dict
from autotune.measure import outcomes
from autotune.measure.measurement import Measurement
from autotune.present.importance import TOP_IMPORTANCES, Importance, knob_importance
from autotune.present.summaries import ranks_json, ranks_rows, speedup_json, speedup_text
from autotune.present.text import (
    counts_text,
    device_memory_text,
    energy_text,
    flag_unstable,
    format_pct,
    markdown_table,
    memory_text,
    printable,
    rate_with_interval,
    shown_config,
    table,
    value_text,
)
from autotune.study.record import TrialRecord
from autotune.study.references import BASELINE, CHECKLIST
from autotune.study.storage import load_ref
from autotune.study.study_record import StudyRecord
from autotune.study.summary import StudySummary, summarize
from autotune.study.urls import redact

ALL_KNOBS = KNOBS + GENERATE_KNOBS  # a training study's knobs, then a generation study's

# --- facts about one study ---------------------------------------------------------------------


@dataclass
class StudyView:
    """One study, read once: its summary, hardware and knob importances."""

    label: str
    ref: str  # redacted
    study: optuna.Study
    summary: StudySummary
    importance: Importance

    @property
    def about(self) -> StudyRecord:
        return self.summary.about

    @property
    def hardware(self) -> dict[str, Any]:
        return self.about.hardware

    @property
    def best_config(self) -> dict[str, Any] | None:
        return self.summary.best.config if self.summary.best else None

    @property
    def best_measurement(self) -> Measurement | None:
        return self.summary.best.measurement if self.summary.best else None

    @property
    def task(self) -> str:
        return self.about.task

    @property
    def torch_version(self) -> str | None:
        return self.hardware.get("torch") or self.about.software.get("torch")


def view_study(study: optuna.Study, ref: str, label: str | None = None) -> StudyView:
    summary = summarize(study)
    return StudyView(label or study.study_name, redact(ref), study, summary, knob_importance(study))


# --- the same configuration elsewhere ----------------------------------------------------------


def differing_knobs(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    a, b = normalize_config_dict(a), normalize_config_dict(b)
    order = list(ALL_KNOBS) + sorted((set(a) | set(b)) - set(ALL_KNOBS))
    return [k for k in order if (k in a or k in b) and a.get(k) != b.get(k)]


@dataclass
class CrossResult:
    """How study `source`'s best configuration did in study `target`."""

    source: str
    target: str
    source_trial: int
    match: str  # "exact", "nearest" or "none"
    trial: int | None = None
    outcome: str | None = None
    tokens_per_sec: float | None = None
    relative_to_best: float | None = None  # against the target study's own best
    differs: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def text(self) -> str:
        """E.g. "a's best (#2) in b: nearest #3, differs in sdpa_backend: 934 tok/s (0.84x b's best)"."""
        head = f"{self.source}'s best (#{self.source_trial}) in {self.target}: "
        if self.match == "none":
            return head + "nothing comparable measured there"
        if self.outcome in outcomes.MEASURED and self.tokens_per_sec is not None:
            rate = f"{self.tokens_per_sec:,.0f} tok/s" + ("" if self.outcome == outcomes.OK else f", {self.outcome}")
        else:
            rate = self.outcome or "?"
        if self.relative_to_best is not None:
            rate += f" ({self.relative_to_best:.2f}x {self.target}'s best)"
        if self.match == "exact":
            return head + f"same configuration, #{self.trial}: {rate}"
        return head + f"nearest: #{self.trial}, differs in {', '.join(self.differs)}: {rate}"


def _finished_with_config(trials: Iterable[TrialRecord]) -> list[TrialRecord]:
    return [t for t in trials if t.config is not None and t.outcome and t.outcome is not outcomes.INTERRUPTED]


def cross_apply(source: StudyView, target: StudyView) -> CrossResult | None:
    """The exact configuration when `target` ran it (a measured run preferred to, e.g., an
    OOM), else the measured trial that differs from it in the fewest knobs. None for a study of
    another task (a training configuration says nothing of a generation study)."""
    if source.summary.best is None or source.task != target.task:
        return None
    config = normalize_config_dict(source.best_config)
    result = CrossResult(source.label, target.label, source.summary.best.number, "none")
    candidates = _finished_with_config(target.summary.trials)
    exact = [t for t in candidates if t.config == config]
    measured = [t for t in candidates if t.measured]
    if exact:
        trial = max(exact, key=lambda t: (t.measured, t.figure or 0.0))
        result.match = "exact"
    elif measured:
        trial = min(
            measured,
            key=lambda t: (len(differing_knobs(config, t.config)), not t.feasible, -(t.figure or 0.0)),
        )
        result.match = "nearest"
        result.differs = differing_knobs(config, trial.config)
    else:
        return result
    result.trial, result.outcome = trial.number, trial.outcome
    if trial.measured:
        result.tokens_per_sec = trial.figure
    best = target.summary.best
    if best is not None and result.tokens_per_sec is not None and best.figure:
        result.relative_to_best = result.tokens_per_sec / best.figure
    return result


# --- the comparison ----------------------------------------------------------------------------


@dataclass
class Comparison:
    views: list[StudyView]
    knobs: list[str]  # knobs of the best configurations, in KNOBS order
    differ: list[str]  # those whose best value is not the same in every study
    cross: list[CrossResult]
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "studies": [_view_dict(v) for v in self.views],
            "knobs": {"all": self.knobs, "differ": self.differ},
            "cross": [c.to_dict() for c in self.cross],
            "notes": self.notes,
        }


def load_comparison(refs: Sequence[str]) -> Comparison:
    """Load every REF and compare them. Studies with one name get their REF as the label."""
    studies = [(ref, load_ref(ref)) for ref in refs]
    names = [s.study_name for _, s in studies]
    views = [
        view_study(s, ref, label=s.study_name if names.count(s.study_name) == 1 else redact(ref)) for ref, s in studies
    ]
    return compare_views(views)


def compare_views(views: list[StudyView]) -> Comparison:
    configs = [normalize_config_dict(v.best_config) for v in views if v.best_config is not None]
    shown = [shown_config(c) for c in configs]  # the multi-rank knobs where a study has several ranks
    knobs = [k for k in ALL_KNOBS if any(k in c for c in shown)]
    differ = [k for k in knobs if len({json.dumps(c.get(k), sort_keys=True) for c in configs}) > 1]
    cross = [r for s in views for t in views if s is not t for r in [cross_apply(s, t)] if r is not None]
    return Comparison(views, knobs, differ, cross, comparability_notes(views))


def comparability_notes(views: Sequence[StudyView]) -> list[str]:
    """Tokens/s compare across devices only for the same model, data and context length."""
    notes = []
    tasks = sorted({v.task for v in views})
    if len(tasks) > 1:
        notes.append(
            f"the studies tune different tasks ({', '.join(tasks)}): a training study's tokens/s are training tokens, "
            "a generation study's output tokens; side by side, not comparable"
        )
    for key, what in (("model", "models"), ("data", "data"), ("seq_len", "context lengths")):
        values = {str(getattr(v.about, key)) for v in views if getattr(v.about, key) is not None}
        if len(values) > 1:
            notes.append(
                f"the studies tuned different {what} ({', '.join(sorted(values))}): "
                "their tokens/s are not directly comparable"
            )
    return notes


def comparison_rows(comp: Comparison) -> tuple[list[str], list[list[str]]]:
    """(headers, rows) of the side-by-side table: one column per study."""
    views = comp.views
    rows: list[list[str]] = []

    def row(label: str, cells: Iterable[str]) -> None:
        rows.append([label, *cells])

    row("storage", (v.ref for v in views))
    row("device", (v.hardware.get("name", "?") for v in views))
    row("device memory", (device_memory_text(v.hardware) for v in views))
    row("torch", (v.torch_version or "?" for v in views))
    if any(v.hardware.get("cuda") for v in views):
        row("CUDA / driver", (f"{v.hardware.get('cuda') or '-'} / {v.hardware.get('driver') or '-'}" for v in views))
    row("task", (v.task for v in views))
    row("model", (f"{v.about.model or '?'} (seq {v.about.seq_len or '?'})" for v in views))
    row("best trial", (f"#{v.summary.best.number}" if v.summary.best else "none within the limit" for v in views))
    row(
        "tokens/s"
        if any(v.task == "generate" for v in views)
        else "effective tokens/s",  # training's effective, generation's output
        (
            flag_unstable(
                rate_with_interval(
                    v.summary.best.figure,
                    v.best_measurement.tokens_per_sec_ci95 if v.best_measurement else None,
                ),
                bool(v.best_measurement and v.best_measurement.unstable),
            )
            if v.summary.best
            else "n/a"
            for v in views
        ),
    )
    if any(v.task == "generate" for v in views):
        row("p99 time per token", (_generation_figure(v, "token_latency_p99_s") for v in views))
        row("p99 time to first token", (_generation_figure(v, "ttft_p99_s") for v in views))
    row(
        "energy",
        (
            energy_text(v.best_measurement.joules_per_token, v.best_measurement.energy_note)
            if v.best_measurement
            else "n/a"
            for v in views
        ),
    )
    row("MFU", (format_pct(v.best_measurement.mfu if v.best_measurement else None) for v in views))
    row(
        "peak memory / limit",
        (
            memory_text(
                v.best_measurement.peak_memory_bytes if v.best_measurement else None, v.about.memory_limit_bytes
            )
            for v in views
        ),
    )
    row("speedup vs baseline", (speedup_text(v.summary, BASELINE) for v in views))
    row("speedup vs checklist", (speedup_text(v.summary, CHECKLIST) for v in views))
    if any(v.summary.world_size > 1 for v in views):  # studies of several ranks: their own figures
        per_view = [dict(ranks_rows(v.summary)) for v in views]
        for label in ("ranks", "global tokens/s", "per-device tokens/s", "scaling efficiency", "straggler ratio"):
            row(label, (figures.get(label, "1" if label == "ranks" else "-") for figures in per_view))
    for knob in comp.knobs:
        mark = "* " if knob in comp.differ else "  "
        row(
            f"{mark}{knob}",
            (value_text(normalize_config_dict(v.best_config).get(knob)) if v.best_config else "-" for v in views),
        )
    for i in range(TOP_IMPORTANCES):
        cells = []
        for v in views:
            top = v.importance.top()
            if v.importance.values is None:
                cells.append((v.importance.note or "n/a") if i == 0 else "")
            else:
                cells.append(f"{top[i][0]} ({v.importance.text(top[i][0], bracketed=False)})" if i < len(top) else "")
        row(f"important knob {i + 1}", cells)
    row(
        "trials",
        (f"{len(v.summary.trials)}: {counts_text(v.summary.counts)}" if v.summary.trials else "0" for v in views),
    )
    return ["", *[v.label for v in views]], rows


def _generation_figure(view: StudyView, key: str) -> str:
    g = view.best_measurement.generation if view.best_measurement else None
    return f"{1000 * g[key]:.2f} ms" if g and g.get(key) is not None else "-"


def _differ_note(comp: Comparison) -> str:
    if comp.differ:
        return "* the best value of this knob differs between the studies"
    if sum(v.best_config is not None for v in comp.views) > 1:
        return "the best configurations agree on every knob"
    return ""


def cross_lines(comp: Comparison) -> list[str]:
    no_best = [
        f"{v.label} has no best ({v.summary.no_best_reason}) to try elsewhere"
        for v in comp.views
        if v.summary.best is None
    ]
    return [c.text() for c in comp.cross] + no_best


def comparison_text(comp: Comparison) -> str:
    headers, rows = comparison_rows(comp)
    out = [table(headers, rows), "", _differ_note(comp)] + [f"note: {printable(n)}" for n in comp.notes]
    if len(comp.views) > 1:
        lines = [f"  {printable(line)}" for line in cross_lines(comp)]
        out += ["", "each best configuration in the other studies:"] + lines
    return "\n".join(out)


def comparison_markdown(comp: Comparison) -> str:
    headers, rows = comparison_rows(comp)
    rows = [[(f"**{r[0].strip()[2:]}** \\*" if r[0].startswith("* ") else r[0].strip()), *r[1:]] for r in rows]
    out = [markdown_table(headers, rows), "", _differ_note(comp).replace("* ", "\\* ", 1)]
    out += [f"\n**Note:** {printable(n)}" for n in comp.notes]
    if len(comp.views) > 1:
        lines = [f"- {printable(line)}" for line in cross_lines(comp)]
        out += ["", "Each best configuration in the other studies:", ""] + lines
    return "\n".join(out) + "\n"


def _view_dict(v: StudyView) -> dict[str, Any]:
    best = v.summary.best
    m = v.best_measurement
    return {
        "label": v.label,
        "study": v.study.study_name,
        "storage": v.ref,
        "hardware": v.hardware,
        "torch": v.torch_version,
        "model": v.about.model,
        "seq_len": v.about.seq_len,
        "task": v.task,
        "memory_limit_bytes": v.about.memory_limit_bytes,
        "best": None
        if best is None
        else {
            "trial": best.number,
            "config": normalize_config_dict(v.best_config),
            "tokens_per_sec": best.figure,
            "tokens_per_sec_runs": list(best.runs),
            "tokens_per_sec_ci95": m.tokens_per_sec_ci95 if m else None,
            "joules_per_token": m.joules_per_token if m else None,
            "energy_note": m.energy_note if m else None,
            "mfu": m.mfu if m else None,
            "peak_memory_bytes": m.peak_memory_bytes if m else None,
            **({"generation": m.generation} if m is not None and m.generation is not None else {}),
        },
        **speedup_json(v.summary),
        **ranks_json(v.summary),
        "importance": v.importance.values,
        "importance_note": v.importance.note,
        "importance_trials": v.importance.n_trials,
        "counts": v.summary.counts,
        "n_trials": len(v.summary.trials),
    }
