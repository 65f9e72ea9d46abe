"""Text for a generation run and a generation study: the figures of one measurement, the best's
table, and the throughput/latency front (the trials no other beats on both output tokens/s and
p99 time per token). Torch-free."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from autotune.measure.measurement import Measurement
from autotune.present.text import (
    config_summary,
    figure_text,
    format_bytes,
    format_rate,
    format_ratio,
    printable,
    table,
)
from autotune.study.record import TrialRecord


def format_ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{1000 * seconds:.2f} ms"


def agreement_text(agreement: Mapping[str, Any]) -> str:
    if not agreement:
        return "n/a"
    rows, new, required, agreed = (agreement.get(k) for k in ("rows", "new_tokens", "required", "agreed_min"))
    if agreed is not None and new is not None and agreed >= new:
        return f"{rows} prompt(s): all {new} tokens identical to the eager float32 reference"
    ties = agreement.get("tie_rows") or 0
    tied = f", {ties} parted at a rounding tie" if ties else ""
    return (
        f"{rows} prompt(s): identical to the eager float32 reference up to token {agreed} (required: {required}){tied}"
    )


OUTPUT = "output tokens/s"


def generation_rows(m: Measurement) -> list[tuple[str, str]]:
    """A generation measurement's figures, one (name, value) row each."""
    g = m.generation or {}
    cache = str(g.get("cache", "?"))
    if g.get("cache_length"):
        cache += f", {g['cache_length']} positions, {format_bytes(g.get('cache_bytes'))}"
    return [
        (
            OUTPUT,
            f"{format_rate(m.tokens_per_sec)}  (batch {g.get('batch_size')} x {g.get('new_tokens')} new tokens, over "
            "whole generations to tokens on the host)",
        ),
        (
            "time to first token",
            f"p50 {format_ms(g.get('ttft_p50_s'))}, p99 {format_ms(g.get('ttft_p99_s'))} ({g.get('runs')} generations)",
        ),
        (
            "time per token",
            f"p50 {format_ms(g.get('token_latency_p50_s'))}, p99 {format_ms(g.get('token_latency_p99_s'))} "
            f"({g.get('token_samples')} decode steps)",
        ),
        ("prefill tokens/s", f"{format_rate(g.get('prefill_tokens_per_sec'))}  (prompt tokens / time to first token)"),
        ("correctness", agreement_text(g.get("agreement") or {})),
        ("cache", cache),
        ("path", str(g.get("path", "?"))),
        (
            "compile time",
            f"{(m.compile_time_s or 0.0):.1f} s (warm-up beyond steady generations: {m.shape_warmup_steps} over every "
            f"prompt layout, then {m.warmup_steps})",
        ),
        ("peak memory", f"{format_bytes(m.peak_memory_bytes)} ({m.peak_memory_source})"),
        ("recompiles", f"{m.recompiles_during_timing} while timed"),
    ]


def format_generation_measurement(m: Measurement) -> str:
    device = m.device.get("name", "?")
    head = f"{m.model.get('name', '')} on {device}: {m.outcome}" + (
        f" ({m.reason.splitlines()[0]})" if m.reason else ""
    )
    lines = [head, f"  config              {config_summary(m.config)}"]
    if m.tokens_per_sec is None or m.generation is None:
        return "\n".join(lines)
    lines += [f"  {name:<20}{value}" for name, value in generation_rows(m)]
    return "\n".join(lines)


def generation_best_table(summary: Any) -> str:
    best = summary.best
    m = best.measurement
    rows = [(k, v) for k, v in (best.config or {}).items()]
    for name, value in generation_rows(m) if m is not None else []:
        # the figure every line of a study shows: the mean of its runs once re-measured
        rows.append(
            (name, value.replace(format_rate(m.tokens_per_sec), figure_text(best), 1) if name == OUTPUT else value)
        )
    rows += [
        ("speedup vs baseline", format_ratio(summary.speedup(summary.baseline))),
        ("speedup vs cure", format_ratio(summary.speedup(summary.checklist))),
    ]
    return table(("best: trial #" + str(best.number), ""), rows)


@dataclass(frozen=True)
class FrontPoint:
    trial: TrialRecord
    tokens_per_sec: float
    token_p99_s: float


def front(trials: list[TrialRecord]) -> list[FrontPoint]:
    """The feasible trials no other feasible trial beats on both output tokens/s and p99 time per
    token, fastest first: the choices between throughput and latency the study found. Output
    tokens/s is each trial's figure, the one every line shows and the best is chosen by (the mean
    of its runs once re-measured: issue D, #1, a front of single runs disagreed with the choice)."""
    points = []
    for t in trials:
        g = t.measurement.generation if t.measurement else None
        if t.feasible and g and t.figure and g.get("token_latency_p99_s") is not None:
            points.append(FrontPoint(t, t.figure, g["token_latency_p99_s"]))

    def beaten(p: FrontPoint) -> bool:
        return any(
            q.tokens_per_sec >= p.tokens_per_sec
            and q.token_p99_s <= p.token_p99_s
            and (q.tokens_per_sec > p.tokens_per_sec or q.token_p99_s < p.token_p99_s)
            for q in points
        )

    return sorted((p for p in points if not beaten(p)), key=lambda p: -p.tokens_per_sec)


def front_text(trials: list[TrialRecord]) -> str:
    points = front(trials)
    if not points:
        return "throughput/latency front: no feasible trial yet"
    lines = ["throughput/latency front (no feasible trial is faster at a lower p99 time per token):"]
    for p in points:
        g = p.trial.measurement.generation
        lines.append(
            f"  #{p.trial.number:<3} {figure_text(p.trial):>9} tok/s  "
            f"p99/token {format_ms(p.token_p99_s):>9}  TTFT p99 {format_ms(g.get('ttft_p99_s')):>9}  "
            f"{printable(config_summary(p.trial.config or {}))}"
        )
    return "\n".join(lines)


def front_json(trials: list[TrialRecord]) -> list[dict[str, Any]]:
    return [
        {
            "trial": p.trial.number,
            "tokens_per_sec": p.tokens_per_sec,
            "token_latency_p99_s": p.token_p99_s,
            "ttft_p99_s": p.trial.measurement.generation.get("ttft_p99_s"),
            "config": p.trial.config,
        }
        for p in front(trials)
    ]


def is_generation(summary: Any) -> bool:
    """A study of generation trials (their measurements carry generation figures)."""
    return any(t.measurement is not None and t.measurement.generation is not None for t in summary.trials)
