"""`autotune report`: one study for a person, readable without Python.

Writes into one folder:

    history.png     effective tokens/s per trial, the best so far, baseline and checklist
    memory.png      tokens/s against peak memory, the memory limit and the Pareto front
    importance.png  which knobs mattered (Optuna's default importance evaluator)
    knobs.png       per knob, the tokens/s of the feasible ok trials by value
    report.md       all of it with the best configuration and the outcome counts, the images
                    referenced relatively (GitHub, editors and notebooks show it as a page)

Figures are drawn on `matplotlib.figure.Figure` (the Agg canvas), never through pyplot,
so nothing needs a display and no global backend is switched.
"""

from __future__ import annotations

import datetime as _dt
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import optuna

from autotune.config import normalize_config_dict
from autotune.device.disk import check_output_folder, write_bytes_atomic, write_text_atomic
from autotune.errors import AutotuneError, UsageError, printable
from autotune.measure import outcomes
from autotune.present.generation import format_ms, front, is_generation
from autotune.present.importance import Importance, knob_importance
from autotune.present.summaries import best_rate_text, ranks_rows, speedup_text
from autotune.present.text import (
    config_summary,
    counts_text,
    energy_text,
    flag_unstable,
    format_bytes,
    format_pct,
    format_rate,
    markdown_table,
    memory_text,
    shown_config,
    value_text,
)
from autotune.study.references import BASELINE, CHECKLIST
from autotune.study.study_record import StudyRecord
from autotune.study.summary import StudySummary, summarize

DPI = 120
CAPTIONS = {
    "history": "Effective tokens/s of every measured trial, in the order they ran, with the best feasible "
    "result so far and the two reference trials (baseline: the untuned fp32 set-up; checklist: "
    "everything switched on).",
    "memory": "Effective tokens/s against peak memory. Circled: the Pareto front, the trials no other "
    "feasible trial beats on both speed and memory. Crosses broke the memory limit.",
    "importance": "How much each knob explains the spread of tokens/s over the searched trials "
    "(Optuna's default importance evaluator; references and reused duplicates left out), with the middle "
    "90 % of it over resamples of the trials; none below 20 searched trials, where a ranking is noise.",
    "knobs": "Per knob, the tokens/s of the searched trials that ran within the memory limit, at each value "
    "(points jittered sideways; boxes where a value has three or more trials). Reference trials are "
    "left out: they change several knobs at once.",
}
# Every file a report writes (checked before anything is drawn: none may be a folder).
REPORT_FILES = (*(f"{name}.png" for name in CAPTIONS), "report.md")
COLORS = {"ok": "#1f77b4", "best": "#ff7f0e", "baseline": "#2ca02c", "checklist": "#9467bd", "bad": "#d62728"}


@dataclass
class Report:
    out_dir: Path
    images: dict[str, Path]
    markdown: Path


@dataclass(frozen=True)
class Point:
    number: int
    tokens_per_sec: float
    peak: int | None
    outcome: str
    feasible: bool
    reference: str | None
    config: dict[str, Any] | None


def trial_points(summary: StudySummary) -> list[Point]:
    """Every trial that has a throughput: the measured ones, and OOM at 0."""
    points = []
    for t in summary.trials:
        if t.measured:
            rate = float(t.figure)
        elif t.outcome is outcomes.OOM:
            rate = 0.0
        else:
            continue
        points.append(Point(t.number, rate, t.peak_memory_bytes, t.outcome, t.feasible, t.reference, t.config))
    return points


def pareto_front(points: Sequence[Point]) -> list[Point]:
    """Feasible points not beaten on both more tokens/s and less peak memory, by memory."""
    front: list[Point] = []
    for p in sorted(
        (p for p in points if p.feasible and p.peak is not None), key=lambda p: (p.peak, -p.tokens_per_sec)
    ):
        if not front or p.tokens_per_sec > front[-1].tokens_per_sec:
            front.append(p)
    return front


# --- figures -----------------------------------------------------------------------------------


def _figure(width: float, height: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=DPI, layout="constrained")


def _rate_axis(axis) -> None:
    from matplotlib.ticker import FuncFormatter

    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))


def _title(study: optuna.Study, what: str) -> str:
    """A figure's title. The study's fields are escaped: matplotlib warns on the terminal of a
    glyph its font lacks (an ESC) with the character itself, and a newline would forge a line."""
    record = StudyRecord.read(study.user_attrs)
    about = f"study {study.study_name}: {record.model or '?'} on {record.hardware.get('name', '?')}"
    return f"{what}\n{printable(about)}"


def _message(fig, text: str) -> None:
    ax = fig.add_subplot()
    ax.set_axis_off()
    ax.text(
        0.5,
        0.5,
        text,
        ha="center",
        va="center",
        fontsize=12,
        wrap=True,
        bbox={"boxstyle": "round", "facecolor": "#f3f3f3", "edgecolor": "#999999"},
    )


def history_figure(study: optuna.Study, summary: StudySummary):
    from matplotlib.ticker import MaxNLocator

    fig = _figure(10, 5.2)
    points = trial_points(summary)
    if not points:
        _message(fig, "no trial was measured yet")
        return fig
    ax = fig.add_subplot()
    groups = [
        (
            "feasible (within the limit less the headroom)",
            [p for p in points if p.feasible and not p.reference],
            "o",
            COLORS["ok"],
        ),
        (
            "over the limit less the headroom",
            [p for p in points if p.outcome == outcomes.OVER_MEMORY_LIMIT],
            "x",
            COLORS["bad"],
        ),
        ("out of memory (plotted at 0)", [p for p in points if p.outcome == outcomes.OOM], "v", COLORS["bad"]),
    ]
    for label, group, marker, color in groups:
        if group:
            ax.scatter(
                [p.number for p in group],
                [p.tokens_per_sec for p in group],
                marker=marker,
                color=color,
                s=40,
                zorder=3,
                label=label,
                clip_on=False,
            )
    best_x, best_y, best = [], [], None
    for p in sorted(points, key=lambda p: p.number):
        if p.feasible and (best is None or p.tokens_per_sec > best):
            best = p.tokens_per_sec
        if best is not None:
            best_x.append(p.number)
            best_y.append(best)
    if best_x:
        ax.step(
            best_x, best_y, where="post", color=COLORS["best"], linewidth=2, zorder=2, label="best so far (feasible)"
        )
    for name, ref, style, marker in (
        ("baseline", summary.baseline, "--", "s"),
        ("checklist", summary.checklist, ":", "D"),
    ):
        if ref is not None:
            rate = ref.figure
            ax.axhline(
                rate,
                color=COLORS[name],
                linestyle=style,
                linewidth=1.5,
                label=f"{name} (#{ref.number}): {rate:,.0f} tokens/s",
            )
            ax.scatter([ref.number], [rate], marker=marker, color=COLORS[name], s=55, zorder=4)
    missing = {
        k: n for k, n in summary.counts.items() if k not in (outcomes.OK, outcomes.OVER_MEMORY_LIMIT, outcomes.OOM)
    }
    if missing:
        ax.text(
            0.01,
            0.02,
            "not plotted (no throughput): " + counts_text(missing),
            transform=ax.transAxes,
            fontsize=9,
            color="#555555",
        )
    ax.set_ylim(bottom=0, top=max(p.tokens_per_sec for p in points) * 1.12)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    _rate_axis(ax.yaxis)
    ax.set_xlabel("trial number")
    ax.set_ylabel("effective tokens/s (non-pad tokens per second)")
    ax.set_title(_title(study, "Optimization history"))
    ax.grid(True, alpha=0.3)
    fig.legend(loc="outside lower center", ncols=3, fontsize=9, frameon=False)
    return fig


def _memory_unit(values: Sequence[float]) -> tuple[str, float]:
    top = max(values) if values else 0
    return ("GiB", 2.0**30) if top >= 2 * 2**30 else ("MiB", 2.0**20)


def memory_figure(study: optuna.Study, summary: StudySummary):
    fig = _figure(10, 5.6)
    points = [p for p in trial_points(summary) if p.peak is not None and p.outcome in outcomes.MEASURED]
    if not points:
        _message(fig, "no measured trial has a peak memory yet")
        return fig
    ax = fig.add_subplot()
    limit = summary.about.memory_limit_bytes
    peaks = [p.peak for p in points]
    limit_on_scale = bool(limit) and limit <= 1.5 * max(peaks)
    unit, scale = _memory_unit(peaks + ([limit] if limit_on_scale else []))
    feasible = [p for p in points if p.feasible]
    infeasible = [p for p in points if not p.feasible]
    if feasible:
        ax.scatter(
            [p.peak / scale for p in feasible],
            [p.tokens_per_sec for p in feasible],
            color=COLORS["ok"],
            s=40,
            zorder=3,
            label="feasible (within the limit less the headroom)",
        )
    if infeasible:
        ax.scatter(
            [p.peak / scale for p in infeasible],
            [p.tokens_per_sec for p in infeasible],
            marker="x",
            color=COLORS["bad"],
            s=50,
            zorder=3,
            label="over the limit less the headroom",
        )
    front = pareto_front(points)
    if front:
        ax.step(
            [p.peak / scale for p in front],
            [p.tokens_per_sec for p in front],
            where="post",
            color=COLORS["best"],
            linewidth=1.5,
            zorder=2,
        )
        ax.scatter(
            [p.peak / scale for p in front],
            [p.tokens_per_sec for p in front],
            s=160,
            facecolors="none",
            edgecolors=COLORS["best"],
            linewidths=2,
            zorder=4,
            label="Pareto front (max tokens/s, min memory)",
        )
    for p in points:
        tag = f"#{p.number}" + (f" {p.reference}" if p.reference else "")
        ax.annotate(
            tag,
            (p.peak / scale, p.tokens_per_sec),
            textcoords="offset points",
            xytext=(6, 4),
            fontsize=8,
            color="#444444",
        )
    if limit and limit_on_scale:
        ax.axvline(
            limit / scale,
            color=COLORS["bad"],
            linestyle="--",
            linewidth=1.5,
            label=f"memory limit {format_bytes(limit)}",
        )
    elif limit:  # a limit far beyond every trial would squash the points against the axis
        ax.plot(
            [],
            [],
            color=COLORS["bad"],
            linestyle="--",
            label=f"memory limit {format_bytes(limit)} (off the scale: every trial used "
            f"{100 * max(peaks) / limit:.0f}% or less)",
        )
    sources = (t.measurement.peak_memory_source for t in summary.trials if t.measurement is not None)
    source = next((s for s in sources if s), None)
    ax.set_xlabel(f"peak memory ({unit}" + (f", {source}" if source else "") + ")")
    ax.set_ylabel("effective tokens/s (non-pad tokens per second)")
    ax.set_ylim(bottom=0, top=max(p.tokens_per_sec for p in points) * 1.15)
    ax.margins(x=0.12)  # room for the trial labels; the x axis need not start at 0
    if limit and limit_on_scale:
        left, right = ax.get_xlim()
        ax.set_xlim(left, max(right, limit / scale * 1.05))
    _rate_axis(ax.yaxis)
    ax.set_title(_title(study, "Throughput against peak memory"))
    ax.grid(True, alpha=0.3)
    fig.legend(loc="outside lower center", ncols=2, fontsize=9, frameon=False)
    return fig


def importance_figure(study: optuna.Study, importance: Importance):
    if importance.values is None:
        fig = _figure(8, 4)
        _message(fig, f"Knob importance: {importance.note}")
        return fig
    ranked = sorted(importance.values.items(), key=lambda kv: kv[1])
    fig = _figure(8, max(3.2, 1.2 + 0.45 * len(ranked)))
    ax = fig.add_subplot()
    # each bar's whisker: the middle 90 % of the knob's importance over resamples of the trials
    spread = [importance.spread.get(k, (v, v)) for k, v in ranked]
    xerr = [
        [100 * max(0.0, v - lo) for (_, v), (lo, _) in zip(ranked, spread)],
        [100 * max(0.0, hi - v) for (_, v), (_, hi) in zip(ranked, spread)],
    ]
    bars = ax.barh([k for k, _ in ranked], [100 * v for _, v in ranked], xerr=xerr, color=COLORS["ok"], capsize=3)
    ax.bar_label(bars, labels=[importance.text(k) for k, _ in ranked], padding=3, fontsize=9)
    ax.set_xlim(0, max(100 * max(v, hi) for (_, v), (_, hi) in zip(ranked, spread)) * 1.45)
    ax.set_xlabel("importance (% of the explained spread of tokens/s)")
    ax.set_ylabel("knob (search dimension)")
    ax.set_title(_title(study, f"Knob importance over {importance.n_trials} searched trials"))
    ax.grid(True, axis="x", alpha=0.3)
    return fig


def _sort_key(value: Any) -> tuple:
    return (0, value, "") if isinstance(value, (int, float)) and not isinstance(value, bool) else (1, 0, str(value))


def _value(knob: str, value: Any) -> Any:
    # Which blocks are checkpointed is many sets; how many is the effect a person can read.
    return len(value or ()) if knob == "checkpoint_layers" else value


def knob_effects(points: Sequence[Point]) -> dict[str, dict[str, list[float]]]:
    """knob -> value (as text, in a sensible order) -> tokens/s, for knobs that vary over
    the feasible ok trials."""
    ok = [p for p in points if p.feasible and p.config and not p.reference]
    effects: dict[str, dict[str, list[float]]] = {}
    configs = [({k: _value(k, v) for k, v in normalize_config_dict(p.config).items()}, p.tokens_per_sec) for p in ok]
    knobs = [k for k in (configs[0][0] if configs else {}) if len({value_text(c.get(k)) for c, _ in configs}) > 1]
    for knob in knobs:
        raw = sorted({(_sort_key(c.get(knob)), value_text(c.get(knob))) for c, _ in configs})
        by_value: dict[str, list[float]] = {text: [] for _, text in raw}
        for c, rate in configs:
            by_value[value_text(c.get(knob))].append(rate)
        effects["checkpointed blocks" if knob == "checkpoint_layers" else knob] = by_value
    return effects


def knobs_figure(study: optuna.Study, summary: StudySummary):
    import numpy as np

    effects = knob_effects(trial_points(summary))
    if not effects:
        fig = _figure(8, 4)
        _message(fig, "Knob effects: no knob took more than one value among the searched feasible ok trials")
        return fig
    ncols = min(3, len(effects))
    nrows = math.ceil(len(effects) / ncols)
    fig = _figure(max(8.0, 4.0 * ncols), 1.0 + 3.2 * nrows)
    rng = np.random.default_rng(0)  # the jitter is the same on every run
    for i, (knob, by_value) in enumerate(effects.items()):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        labels = list(by_value)
        for x, value in enumerate(labels):
            rates = by_value[value]
            if len(rates) >= 3:
                ax.boxplot(
                    [rates],
                    positions=[x],
                    widths=0.5,
                    showfliers=False,
                    manage_ticks=False,
                    medianprops={"color": COLORS["best"]},
                )
            jitter = rng.uniform(-0.12, 0.12, len(rates)) if len(rates) > 1 else np.zeros(1)
            ax.scatter(x + jitter, rates, color=COLORS["ok"], s=22, alpha=0.8, zorder=3)
        ax.set_xticks(
            range(len(labels)),
            [f"{v}\n(n={len(by_value[v])})" for v in labels],
            fontsize=8 if len(labels) <= 6 else 6.5,
        )
        ax.set_xlim(-0.6, len(labels) - 0.4)
        ax.set_ylim(bottom=0)
        ax.set_title(knob, fontsize=11)
        _rate_axis(ax.yaxis)
        if i % ncols == 0:
            ax.set_ylabel("effective tokens/s")
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(_title(study, "Effect of each knob (searched trials within the memory limit)"))
    return fig


# --- text --------------------------------------------------------------------------------------


@dataclass
class Section:
    title: str
    headers: list[str]
    rows: list[list[str]]
    note: str | None = None


def _measurement_rows(summary: StudySummary, limit: int | None) -> list[list[str]]:
    best = summary.best
    m = best.measurement
    if m is None:
        return [["effective tokens/s", format_rate(best.figure)]]
    rate = best_rate_text(best, " / ")
    return [
        ["effective tokens/s", flag_unstable(rate, m.unstable)],
        ["energy", energy_text(m.joules_per_token, m.energy_note, m.energy_source)],
        ["padding", format_pct(m.padding_fraction)],
        ["step time (median)", f"{1000 * m.step_time_median_s:.1f} ms" if m.step_time_median_s else "n/a"],
        ["step time CV", format_pct(m.step_time_cv) + (" (unstable: verify the recipe)" if m.unstable else "")],
        ["MFU", format_pct(m.mfu)],
        [
            "peak memory / limit",
            memory_text(m.peak_memory_bytes, limit) + (f" ({m.peak_memory_source})" if m.peak_memory_source else ""),
        ],
        ["speedup vs baseline", speedup_text(summary, BASELINE)],
        ["speedup vs checklist", speedup_text(summary, CHECKLIST)],
        *([label, text] for label, text in ranks_rows(summary)),
    ]


def _top_trials(summary: StudySummary, n: int = 10) -> list[list[str]]:
    best = summary.best.number if summary.best is not None else None
    measured = [t for t in summary.trials if t.measured]
    measured.sort(key=lambda t: (t.number == best, t.feasible, t.figure or 0.0), reverse=True)
    rows = []
    for t in measured[:n]:
        tag = t.reference or (t.proposed_by or "").replace("_", " ")
        rows.append(
            [
                f"#{t.number}" + (" (best)" if t.number == best else ""),
                t.status,
                flag_unstable(format_rate(t.figure), t.unstable),
                format_bytes(t.peak_memory_bytes),
                tag,
                config_summary(t.config) if t.config else "",
            ]
        )
    return rows


def report_sections(study: optuna.Study, summary: StudySummary, importance: Importance) -> list[Section]:
    record = summary.about
    hw, software, limit = record.hardware, record.software, record.memory_limit_bytes
    about = [
        ["model", f"{record.model or '?'} (context {record.seq_len or '?'}, {record.n_layer or '?'} blocks)"],
        ["data", record.data or "?"],
        ["device", f"{hw.get('name', '?')} ({hw.get('kind', '?')})"],
        ["device memory", format_bytes(hw.get("total_memory_bytes")) if hw.get("total_memory_bytes") else "n/a"],
        ["memory limit", format_bytes(limit)],
        ["torch / optuna", f"{hw.get('torch') or software.get('torch', '?')} / {software.get('optuna', '?')}"],
        ["trials", f"{len(summary.trials)}"],
    ]
    if hw.get("cuda"):
        about.insert(4, ["CUDA / driver", f"{hw.get('cuda')} / {hw.get('driver') or '?'}"])
    sections = [Section("Study", ["", ""], about)]
    if summary.best is None:
        sections.append(Section("Best configuration", ["", ""], [], note=summary.no_best_reason))
    else:
        config = shown_config(summary.best.config)  # one process: no multi-rank knob
        sections.append(
            Section(
                f"Best configuration (trial #{summary.best.number})",
                ["knob", "value"],
                [[k, value_text(v)] for k, v in config.items()],
            )
        )
        sections.append(Section("Its measurement", ["", ""], _measurement_rows(summary, limit)))
    refs = [
        [name, f"#{t.number}", flag_unstable(format_rate(t.figure), t.unstable)]
        for name, t in (("baseline", summary.baseline), ("checklist", summary.checklist))
        if t is not None
    ]
    if refs:
        sections.append(Section("Reference trials", ["reference", "trial", "effective tokens/s"], refs))
    if is_generation(summary):
        sections.append(_front_section(summary))
    sections.append(
        Section(
            "Outcomes",
            ["outcome", "trials"],
            [[k, str(n)] for k, n in sorted(summary.counts.items(), key=lambda kv: (-kv[1], kv[0]))],
            note=None if summary.trials else "no trials yet",
        )
    )
    sections.append(
        Section(
            f"Knob importance ({importance.n_trials} searched trials)",
            ["knob", "importance"],
            [[k, importance.text(k)] for k, _ in importance.top(len(importance.values or {}))],
            note=importance.note,
        )
    )
    sections.append(
        Section(
            "Top trials", ["trial", "outcome", "tokens/s", "peak memory", "note", "configuration"], _top_trials(summary)
        )
    )
    return sections


def _front_section(summary: StudySummary) -> Section:
    """A generation study's throughput/latency front (`present.generation.front`)."""
    rows = [
        [
            f"#{p.trial.number}",
            format_rate(p.tokens_per_sec),
            format_ms(p.token_p99_s),
            format_ms(p.trial.measurement.generation.get("ttft_p99_s")),
            config_summary(p.trial.config or {}),
        ]
        for p in front(summary.trials)
    ]
    return Section(
        "Throughput/latency front",
        ["trial", "output tokens/s", "p99 per token", "p99 first token", "configuration"],
        rows,
        note="the feasible trials no other is faster than at a lower p99 time per token" if rows else "none yet",
    )


def render_markdown(
    study: optuna.Study, sections: Sequence[Section], images: dict[str, Path], storage: str | None, created: str
) -> str:
    out = [
        f"# autotune report: study {study.study_name}",
        "",
        f"written {created}" + (f" from `{storage}`" if storage else ""),
        "",
    ]

    def add(section: Section) -> None:
        out.extend([f"## {section.title}", ""])
        if section.note:
            out.extend([section.note, ""])
        if section.rows:
            out.extend([markdown_table(section.headers, section.rows), ""])

    for section in sections[:-1]:
        add(section)
    out.extend(["## Figures", ""])
    for name, path in images.items():
        out.extend([f"![{name}]({path.name})", "", f"*{CAPTIONS[name]}*", ""])
    add(sections[-1])
    hint = f"autotune dashboard --study {study.study_name}" + (f" --storage {storage}" if storage else "")
    out.extend([f"To explore every trial interactively: `{hint}`", ""])
    return "\n".join(out)


def require_matplotlib() -> None:
    """matplotlib is a dependency of autotune; an environment that lost it gets one clear line."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError(
            "autotune report draws its figures with matplotlib, which is not installed: pip install matplotlib"
        ) from None


def write_report(study: optuna.Study, out_dir: str | Path, storage: str | None = None) -> Report:
    """Draw the figures and write report.md beside them into `out_dir`. `storage` is
    shown as given: pass it redacted."""
    require_matplotlib()
    out = check_output_folder(out_dir, REPORT_FILES, what="--out")
    summary = summarize(study)  # first: a study that cannot be read leaves no empty folder behind
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AutotuneError(f"cannot create {out}: {exc.strerror}") from None
    importance = knob_importance(study)
    figures = {
        "history": history_figure(study, summary),
        "memory": memory_figure(study, summary),
        "importance": importance_figure(study, importance),
        "knobs": knobs_figure(study, summary),
    }
    images: dict[str, Path] = {}
    for name, fig in figures.items():
        png = io.BytesIO()
        fig.savefig(png, format="png", dpi=DPI, facecolor="white")
        images[name] = write_bytes_atomic(out / f"{name}.png", png.getvalue(), what="report")
    created = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
    sections = report_sections(study, summary, importance)
    md = render_markdown(study, sections, images, storage, created)
    return Report(out, images, write_text_atomic(out / "report.md", md, what="report"))
