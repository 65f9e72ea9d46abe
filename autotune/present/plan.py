"""`autotune plan`'s answer as text, read from its JSON object (`search.plan.make_plan`)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from autotune.present.text import config_summary, format_rate, table
from autotune.units import format_bytes


def plan_text(plan: Mapping[str, Any]) -> str:
    device, seq = plan["device"], plan["seq_len"]
    card = f"{device['card']}: " if device["card"] else ""
    memory = f"{format_bytes(device['memory_bytes'])}, " if device["memory_bytes"] else ""
    capability = f"compute capability {device['compute_capability']}" if device["compute_capability"] else "CPU"
    lines = [
        f"{plan['model']} on {device['name']} ({card}{memory}{capability}), sequences of {seq} tokens",
        "A model, not a measurement: the search's memory model and planner, asked "
        + (f"after {plan['calibrated_on']} measured peaks." if plan["calibrated_on"] else "before any trial."),
        plan["validated"],
        f"Memory limit {format_bytes(plan['memory_limit_bytes'])}{_share(plan)} less {plan['memory_headroom']:.0%} "
        f"headroom: a peak of at most {format_bytes(plan['feasible_bytes'])}.",
        "",
        "Memory by family, the other knobs at their defaults (peak = static + per token x token budget); the "
        "largest token budget likely to fit (50 %), in parentheses with the prior raised by the most it fell short "
        "when measured, in brackets where the model's 95 % band puts it:",
        _families(plan),
        "",
        f"Token budget {plan['target_budget']:,} in one micro-batch: the fewest blocks to checkpoint, per family:",
        *(f"  {_family_name(r['config'])}: {_blocks(r)}" for r in plan["least_checkpointing"]),
        "",
        *_verdict(plan),
        "",
        _ceiling(plan),
        *_calibration(plan),
    ]
    return "\n".join(lines)


def _share(plan: Mapping[str, Any]) -> str:
    total = plan["device"]["memory_bytes"]
    return f" ({plan['memory_limit_bytes'] / total:.0%} of {format_bytes(total)})" if total else ""


def _family_name(config: Mapping[str, Any]) -> str:
    return f"{config['amp_dtype']} {config['sdpa_backend']} attention, {config['loss_impl']} loss"


def _budget(value: int | None) -> str:
    return "not one sequence" if value is None else f"{value:,}"


def _band(budget: Mapping[str, int | None]) -> str:
    within, low, high = (budget[k] or 0 for k in ("within_error", "low", "high"))
    return f"{_budget(budget['likely'])} ({within:,}) [{low:,} - {high:,}]"


def _families(plan: Mapping[str, Any]) -> str:
    rows: dict[tuple, dict[int, Mapping[str, Any]]] = {}
    for f in plan["families"]:
        c = f["config"]
        rows.setdefault((c["amp_dtype"], c["sdpa_backend"], c["loss_impl"]), {})[f["checkpointed"]] = f
    cells = []
    for (dtype, kernel, loss), by_blocks in rows.items():
        none, every = by_blocks[min(by_blocks)], by_blocks[max(by_blocks)]
        cells.append(
            [
                dtype,
                kernel,
                loss,
                format_bytes(none["static_bytes"]),
                f"{format_bytes(none['per_token_bytes'])} / {format_bytes(every['per_token_bytes'])}",
                _band(none["largest_budget"]),
                _band(every["largest_budget"]),
            ]
        )
    blocks = max(f["checkpointed"] for f in plan["families"])
    headers = ["dtype", "attention", "loss", "static", f"per token (0 / {blocks} ckpt)", "largest budget"]
    return table([*headers, f"with {blocks} checkpointed"], cells)


def _blocks(row: Mapping[str, Any]) -> str:
    if row["blocks"] is None:
        return f"does not fit even with all {row['of']} checkpointed"
    return f"{row['blocks']} of {row['of']}"


def _verdict(plan: Mapping[str, Any]) -> list[str]:
    v = plan["verdict"]
    one = v["one_sequence"]
    peak = f"{format_bytes(one['peak_bytes'])} (95 %: {_bytes_band(one)})"
    leanest = f"{_family_name(v['leanest'])}, {len(v['leanest']['checkpoint_layers'])} blocks checkpointed"
    if v["trains"]:
        lines = [f"Trains here: one sequence of its leanest family ({leanest}) needs {peak}."]
    else:
        lines = [
            f"Does not train here: one sequence of its leanest family ({leanest}) needs {peak}, "
            f"{format_bytes(v['short_by_bytes'])} over the limit."
        ]
    lines += [f"  - {r}" for r in v["remedies"]]
    lines.append(f"  Cards it likely fits on (one sequence): {', '.join(v['cards']) or 'none the project knows'}")
    return lines


def _bytes_band(p: Mapping[str, Any]) -> str:
    return f"{format_bytes(p['low_bytes'])} - {format_bytes(p['high_bytes'])}"


def trials_text(trials: Sequence[Mapping[str, Any]]) -> str:
    """The planner's first trials (`search.plan.first_trials`)."""
    lines = [
        "",
        "The search's first trials here, as its planner proposes them before any trial has finished (a new "
        "study runs the baseline and checklist references first; the trials after these depend on what they measure):",
    ]
    for n, t in enumerate(trials, 1):
        lines.append(f"  {n}. {config_summary(t['config'])}")
        lines.append(f"     predicted peak {format_bytes(t['peak_bytes'])} (95 %: {_bytes_band(t)}); {t['reason']}")
    return "\n".join(lines)


def _ceiling(plan: Mapping[str, Any]) -> str:
    c = plan["ceiling"]
    if not c["tokens_per_sec"]:
        return "Ceiling: no peak FLOP/s is known for this device, so no tokens/s ceiling."
    line = (
        f"Ceiling: at most {format_rate(c['tokens_per_sec'])} tokens/s, an upper bound: 100 % MFU of the dense "
        f"{c['amp_dtype']} peak {c['peak_flops'] / 1e12:,.0f} TFLOP/s at {c['flops_per_token'] / 1e9:,.2f} GFLOP a "
        "token (6N + 12 L d T)"
    )
    if c["measured_tokens_per_sec"]:
        line += (
            f"; {format_rate(c['measured_tokens_per_sec'])} at the {c['measured_peak_flops'] / 1e12:,.0f} TFLOP/s "
            "a large matmul was measured to reach on this card"
        )
    return line + ". Training steps reach a fraction of it."


def _calibration(plan: Mapping[str, Any]) -> list[str]:
    rows = plan["calibration"]
    if not rows:
        return []

    def error(predicted: int, measured: int) -> str:
        return f"{format_bytes(predicted)} ({predicted / measured - 1:+.0%})"

    cells = [
        [
            f"#{r['trial']}",
            config_summary(r["config"]),
            format_bytes(r["measured_bytes"]),
            error(r["prior_bytes"], r["measured_bytes"]),
            error(r["calibrated_bytes"], r["measured_bytes"]),
        ]
        for r in rows
    ]
    return [
        "",
        "The study's measured peaks, the prior's prediction, and the model's fitted to the other trials:",
        table(["trial", "configuration", "measured", "prior", "calibrated"], cells),
    ]
