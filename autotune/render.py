"""Text for people: the one-screen summary of a measurement, and small tables."""

from __future__ import annotations

from typing import Any, Sequence

from autotune.measure import Measurement
from autotune.outcomes import format_bytes


def format_rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f}"


def format_pct(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{100 * value:.{digits}f}%"


def config_summary(config: dict[str, Any]) -> str:
    """The knobs that matter, in one short line."""
    parts = [
        f"amp={config['amp_dtype']}",
        f"compile={config['compile_mode']}",
        f"sdpa={config['sdpa_backend']}",
        f"budget={config['token_budget']}",
        f"batching={config['batching']}",
        f"workers={config['num_workers']}",
    ]
    if config.get("prefetch_factor"):
        parts.append(f"prefetch={config['prefetch_factor']}")
    if config.get("pin_memory"):
        parts.append("pin")
    layers = config.get("checkpoint_layers") or []
    parts.append(f"ckpt={','.join(map(str, layers)) if layers else '-'}")
    return " ".join(parts)


def format_measurement(m: Measurement) -> str:
    device = m.device.get("name", "?")
    lines = [f"{m.model.get('name', '')} on {device}: {m.outcome}" + (f" ({m.reason.splitlines()[0]})" if m.reason else "")]
    lines.append(f"  config              {config_summary(m.config)}")
    if m.tokens_per_sec is None:
        if m.reason and "\n" in m.reason:
            lines.append("  " + m.reason.replace("\n", "\n  "))
        return "\n".join(lines)
    rows = [
        ("effective tokens/s", f"{format_rate(m.tokens_per_sec)}  (non-pad tokens / wall time, data waits included)"),
        ("padded tokens/s", f"{format_rate(m.padded_tokens_per_sec)}  (padding {format_pct(m.padding_fraction)})"),
        ("step time", f"{1000 * m.step_time_median_s:.1f} ms median, CV {format_pct(m.step_time_cv)} over {m.steps} steps"
                      + ("  UNSTABLE" if m.unstable else "")),
        ("data wait", format_pct(m.data_wait_fraction)),
        ("compile time", f"{m.compile_time_s:.1f} s (warm-up time beyond a timed step; {m.warmup_steps} warm-up steps)"),
        ("MFU", format_pct(m.mfu) if m.mfu is not None else "n/a (peak FLOPs unknown for this device)"),
        ("peak memory", f"{format_bytes(m.peak_memory_bytes)} ({m.peak_memory_source})"
                        + (f", allocator peak {format_bytes(m.allocator_peak_bytes)}" if m.allocator_peak_bytes else "")),
        ("GPU utilization", format_pct(m.gpu_utilization) if m.gpu_utilization is not None else "n/a"),
    ]
    if m.recompiles_during_timing:
        rows.append(("recompiles", f"{m.recompiles_during_timing} during the timed steps (their time is included)"))
    lines += [f"  {name:<20}{value}" for name, value in rows]
    return "\n".join(lines)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain aligned text table."""
    cells = [[str(h) for h in headers]] + [[("" if c is None else str(c)) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    out = []
    for n, row in enumerate(cells):
        out.append("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


# --- studies -------------------------------------------------------------------------------


def _trial_cfg(trial) -> dict[str, Any] | None:
    return trial.user_attrs.get("config")


def trial_line(trial) -> str:
    """One line per finished trial: number, outcome, tokens/s, peak memory, the knobs."""
    attrs = trial.user_attrs
    outcome = attrs.get("outcome", trial.state.name.lower())
    tag = f" [{attrs['reference']}]" if attrs.get("reference") else ""
    dup = f" (same as #{attrs['duplicate_of']})" if "duplicate_of" in attrs else ""
    cfg = _trial_cfg(trial)
    knobs = config_summary(cfg) if cfg else ""
    reason = ""
    if outcome not in ("ok",) and attrs.get("reason"):
        reason = f"  -- {attrs['reason'].splitlines()[0][:120]}"
    return (f"#{trial.number:<3} {outcome:<17} {format_rate(attrs.get('tokens_per_sec')):>12} tok/s  "
            f"peak {format_bytes(attrs.get('peak_memory_bytes')):>10}  {knobs}{tag}{dup}{reason}")


def _speedup(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def best_table(summary) -> str:
    best = summary.best
    m = best.user_attrs.get("measurement") or {}
    rows = [(k, v if not isinstance(v, list) else ",".join(map(str, v)) or "-") for k, v in _trial_cfg(best).items()]
    rows += [
        ("effective tokens/s", format_rate(m.get("tokens_per_sec"))),
        ("padding", format_pct(m.get("padding_fraction"))),
        ("step time CV", format_pct(m.get("step_time_cv"))),
        ("MFU", format_pct(m.get("mfu")) if m.get("mfu") is not None else "n/a"),
        ("peak memory", f"{format_bytes(m.get('peak_memory_bytes'))} ({m.get('peak_memory_source')})"),
        ("speedup vs baseline", _speedup(summary.speedup(summary.baseline))),
        ("speedup vs checklist", _speedup(summary.speedup(summary.checklist))),
    ]
    return table(("best: trial #" + str(best.number), ""), rows)


def _counts_line(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {k}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def search_summary(result) -> str:
    summary = result.summary
    lines = [f"study {summary.name}: {len(summary.trials)} trials ({_counts_line(summary.counts)}); "
             f"memory limit {format_bytes(result.context.memory_limit_bytes)}"]
    for name, ref in (("baseline", summary.baseline), ("checklist", summary.checklist)):
        if ref is not None:
            lines.append(f"{name:<10} #{ref.number}: {format_rate(ref.user_attrs.get('tokens_per_sec'))} tok/s "
                         f"({ref.user_attrs.get('outcome')})")
    if summary.best is None:
        lines.append(summary.no_best_reason)
        return "\n".join(lines)
    lines += ["", best_table(summary)]
    if result.recipe_path:
        lines.append(f"\nrecipe: {result.recipe_path}")
    return "\n".join(lines)


def _trial_json(trial) -> dict[str, Any]:
    a = trial.user_attrs
    return {"number": trial.number, "state": trial.state.name, "outcome": a.get("outcome"), "reason": a.get("reason"),
            "reference": a.get("reference"), "config": a.get("config"), "tokens_per_sec": a.get("tokens_per_sec"),
            "peak_memory_bytes": a.get("peak_memory_bytes"), "constraints": trial.constraints or None,
            "duplicate_of": a.get("duplicate_of")}


def summary_json(result) -> dict[str, Any]:
    from autotune.storage import redact

    s = result.summary
    return {
        "study": s.name,
        "storage": redact(result.storage_url),
        "memory_limit_bytes": result.context.memory_limit_bytes,
        "device": result.context.device.to_dict(),
        "counts": s.counts,
        "best": _trial_json(s.best) | {"measurement": s.best.user_attrs.get("measurement")} if s.best else None,
        "baseline": _trial_json(s.baseline) if s.baseline else None,
        "checklist": _trial_json(s.checklist) if s.checklist else None,
        "speedup_vs_baseline": s.speedup(s.baseline),
        "speedup_vs_checklist": s.speedup(s.checklist),
        "recipe": str(result.recipe_path) if result.recipe_path else None,
        "n_trials": len(s.trials),
    }


def _ranked(summary) -> list:
    def key(t):
        feasible = all(v <= 0 for v in (t.constraints or {}).values())
        return (t.user_attrs.get("outcome") == "ok" and feasible, t.user_attrs.get("tokens_per_sec") or 0.0)

    return sorted(summary.trials, key=key, reverse=True)


def show_text(study, summary, limit: int) -> str:
    hw = study.user_attrs.get("hardware", {})
    lines = [f"study {study.study_name}: model {study.user_attrs.get('model')} on {hw.get('name', '?')}, "
             f"memory limit {format_bytes(study.user_attrs.get('memory_limit_bytes'))}",
             f"trials: {len(summary.trials)} ({_counts_line(summary.counts)})", ""]
    for trial in _ranked(summary)[:limit]:
        lines.append(trial_line(trial))
    if summary.best is not None:
        lines += ["", best_table(summary)]
    else:
        lines.append("\n" + summary.no_best_reason)
    return "\n".join(lines)


def show_json(study, summary) -> dict[str, Any]:
    s = summary
    return {
        "study": study.study_name,
        "model": study.user_attrs.get("model"),
        "hardware": study.user_attrs.get("hardware"),
        "memory_limit_bytes": study.user_attrs.get("memory_limit_bytes"),
        "counts": s.counts,
        "best": _trial_json(s.best) if s.best else None,
        "speedup_vs_baseline": s.speedup(s.baseline),
        "speedup_vs_checklist": s.speedup(s.checklist),
        "trials": [_trial_json(t) for t in _ranked(s)],
    }
