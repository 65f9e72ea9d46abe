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
