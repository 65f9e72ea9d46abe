"""Text and JSON for people and scripts: a measurement, a trial, a search's summary, a
stored study (`show`), a verification and a profile. Torch-free: `show` reads a study
without importing torch."""

from __future__ import annotations

from typing import Any

from autotune.measure import outcomes
from autotune.measure.measurement import Measurement
from autotune.present.generation import front_json, front_text, generation_best_table, is_generation
from autotune.present.text import (
    config_summary,
    counts_text,
    energy_text,
    figure_text,
    flag_unstable,
    format_bytes,
    format_pct,
    format_rate,
    format_ratio,
    printable,
    rate_with_interval,
    shown_config,
    table,
)
from autotune.study.record import TrialRecord
from autotune.study.references import BASELINE, CHECKLIST, INFEASIBLE, UNSTABLE
from autotune.study.urls import default_storage_url, redact


def format_measurement(m: Measurement) -> str:
    device = m.device.get("name", "?")
    lines = [
        f"{m.model.get('name', '')} on {device}: {m.outcome}" + (f" ({m.reason.splitlines()[0]})" if m.reason else "")
    ]
    lines.append(f"  config              {config_summary(m.config)}")
    if m.tokens_per_sec is None:
        if m.reason and "\n" in m.reason:
            lines.append("  " + m.reason.replace("\n", "\n  "))
        return "\n".join(lines)
    rows = [
        (
            "effective tokens/s",
            f"{flag_unstable(rate_with_interval(m.tokens_per_sec, m.tokens_per_sec_ci95), m.unstable)}  (non-pad "
            "tokens / wall time, data waits included)",
        ),
        ("padded tokens/s", f"{format_rate(m.padded_tokens_per_sec)}  (padding {format_pct(m.padding_fraction)})"),
        (
            "step time",
            f"{1000 * m.step_time_median_s:.1f} ms median, CV {format_pct(m.step_time_cv)} over {m.steps} "
            + ("micro-steps" if m.accumulation_steps > 1 else "steps")
            + ("  UNSTABLE" if m.unstable else ""),
        ),
        ("data wait", format_pct(m.data_wait_fraction)),
        (
            "compile time",
            f"{m.compile_time_s:.1f} s (warm-up time beyond steady steps; {m.shape_warmup_steps} steps over every "
            f"batch shape, then {m.warmup_steps} on data)",
        ),
        ("MFU", mfu_text(m.mfu, m.mfu_at_context, m.mfu_measured_peak)),
        (
            "peak memory",
            f"{format_bytes(m.peak_memory_bytes)} ({m.peak_memory_source})"
            + (f", allocator peak {format_bytes(m.allocator_peak_bytes)}" if m.allocator_peak_bytes else ""),
        ),
        ("GPU utilization", format_pct(m.gpu_utilization) if m.gpu_utilization is not None else "n/a"),
        ("energy", energy_text(m.joules_per_token, m.energy_note, m.energy_source)),
    ]
    if m.global_batch_tokens is not None:
        rows.append(
            (
                "global batch",
                f"{m.global_batch_tokens} tokens per optimizer step: {m.accumulation_steps} micro-batches of "
                f"{m.global_batch_tokens // m.accumulation_steps} ({m.optimizer_steps} optimizer steps timed)",
            )
        )
    if m.retimed_windows:
        rows.append(("re-timed", f"{m.retimed_windows} window(s) dropped: something compiled or recorded in them"))
    if m.recompiles_during_timing:
        rows.append(
            ("recompiles", f"{m.recompiles_during_timing} compile events in the timed steps (their time is included)")
        )
    lines += [f"  {name:<20}{value}" for name, value in rows]
    return "\n".join(lines)


def mfu_text(mfu: float | None, at_context: float | None, measured_peak: float | None = None) -> str:
    """Against the datasheet's peak; and against a large matmul's measured peak where one is known."""
    if mfu is None:
        return "n/a (no peak FLOPs for this device)"
    text = format_pct(mfu) + " of the datasheet's peak"
    if at_context is not None and abs(at_context - mfu) >= 5e-4:
        text = f"{format_pct(mfu)} at the mean padded length, {format_pct(at_context)} at the full context (datasheet)"
    if measured_peak is not None:
        text += f"; {format_pct(measured_peak)} of a large matmul's measured peak"
    return text


# --- studies (every trial a `study.record.TrialRecord`) --------------------------------------


def _unstable_note(trial: TrialRecord) -> str:
    if not trial.unstable:
        return ""
    return f"  UNSTABLE (step time CV {format_pct(trial.step_time_cv)})"


def best_rate_text(trial: TrialRecord, sep: str = "/") -> str:
    """The best's tokens/s with the 95 % interval of that figure (`TrialRecord.figure_ci95`):
    beside the mean of its runs, the interval of the mean, or why there is none."""
    rate = rate_with_interval(trial.figure, trial.figure_ci95)
    if trial.confirmed:
        why = ""
        if trial.figure_ci95 is None and trial.measurement and trial.measurement.tokens_per_sec_ci95:
            if trial.confirmation and trial.confirmation.tokens_per_sec_ci95:
                why = "; no interval: they differ by more than their own intervals allow"
        runs = sep.join(format_rate(r) for r in trial.runs)
        again = "s" if len(trial.runs) > 2 else ""
        rate += f"  (mean of {runs}: the trial, then its re-measurement{again}{why})"
    return rate


def trial_line(trial: TrialRecord) -> str:
    """One line per finished trial: number, outcome, tokens/s, peak memory, the knobs."""
    outcome = trial.status
    # A generation study's second reference is the article's cure (stored under the checklist's name).
    cure = trial.reference == "checklist" and "kv_cache" in (trial.config or {})
    tag = f" [{'cure' if cure else trial.reference}]" if trial.reference else ""
    if trial.proposed_by:
        tag = f" [{trial.proposed_by.replace('_', ' ')}]"
    dup = f" (same as #{trial.duplicate_of})" if trial.duplicate_of is not None else ""
    knobs = config_summary(trial.config) if trial.config else ""
    reason = ""
    if outcome != outcomes.OK and trial.reason:  # what keeps it from the best
        reason = f"  -- {printable(trial.reason.splitlines()[0][:120])}"
    return (
        f"#{trial.number:<3} {outcome:<17} {figure_text(trial):>12} tok/s  "
        f"peak {format_bytes(trial.peak_memory_bytes):>10}  {knobs}{tag}{dup}{_unstable_note(trial)}{reason}"
    )


def speedup_text(summary, name: str) -> str:
    """The best's speedup over reference trial `name` (baseline, checklist), with what makes it
    less than it says: "99.72x (the baseline was unstable: step time CV 113.0%)"."""
    reference = _reference(summary, name)
    ratio = format_ratio(summary.speedup(reference))
    caveats = [_SPEEDUP_CAVEATS[flag](name, reference) for flag in summary.speedup_flags(reference)]
    return f"{ratio} ({'; '.join(caveats)})" if caveats else ratio


def speedup_json(summary) -> dict[str, Any]:
    """The speedups as JSON: each figure, and its flags (`StudySummary.speedup_flags`)."""
    data: dict[str, Any] = {}
    for name in (BASELINE, CHECKLIST):
        reference = _reference(summary, name)
        data[f"speedup_vs_{name}"] = summary.speedup(reference)
        data[f"speedup_vs_{name}_flags"] = summary.speedup_flags(reference)
    return data


def _reference(summary, name: str) -> TrialRecord | None:
    return summary.baseline if name == BASELINE else summary.checklist


_SPEEDUP_CAVEATS = {
    UNSTABLE: lambda name, t: f"the {name} was unstable: step time CV {format_pct(t.step_time_cv)}",
    INFEASIBLE: lambda name, t: f"the {name} broke the memory limit",
}


def best_table(summary) -> str:
    best = summary.best
    if best.measurement is not None and best.measurement.generation is not None:
        return generation_best_table(summary)
    m = best.measurement or Measurement.failed({}, outcomes.OK, None)
    rows = [
        (k, v if not isinstance(v, list) else ",".join(map(str, v)) or "-")
        for k, v in shown_config(best.config).items()
    ]
    rate = best_rate_text(best)
    rows += [
        ("effective tokens/s", flag_unstable(rate, m.unstable)),
        ("energy", energy_text(m.joules_per_token, m.energy_note, m.energy_source)),
        ("padding", format_pct(m.padding_fraction)),
        ("step time CV", format_pct(m.step_time_cv) + ("  UNSTABLE: verify the recipe" if m.unstable else "")),
        ("MFU", format_pct(m.mfu)),
        ("peak memory", f"{format_bytes(m.peak_memory_bytes)} ({m.peak_memory_source})"),
        ("speedup vs baseline", speedup_text(summary, BASELINE)),
        ("speedup vs checklist", speedup_text(summary, CHECKLIST)),
    ]
    rows += ranks_rows(summary)
    rows += _leader_rows(summary)
    return table(("best: trial #" + str(best.number), ""), rows)


def ranks_rows(summary) -> list[tuple[str, str]]:
    """The best's figures of several ranks (none for one process): global and per-device tokens/s,
    scaling efficiency against N x the best on one rank, the straggler ratio, a rank's start."""
    m = summary.best.measurement if summary.best is not None else None
    if m is None or m.world_size <= 1:
        return []
    n = m.world_size
    single = summary.single_rank or {}
    efficiency = summary.scaling_efficiency
    if efficiency is not None:
        scaling = (
            f"{format_pct(efficiency)}  (global over {n} x {format_rate(single.get('tokens_per_sec'))} tok/s: the "
            "same configuration on one rank)"
        )
    elif single.get("trial") == summary.best.number:
        scaling = f"n/a: the single-rank reference ended {single.get('outcome')} ({single.get('reason') or '-'})"
    else:
        scaling = "n/a: no single-rank reference measured yet (the search measures one for its best)"
    waits = ", ".join(format_pct(r.get("data_wait_fraction")) for r in m.ranks) or "n/a"
    start = m.phase_s.get("rank_start")
    return [
        ("ranks", f"{n} (one launch of {n} processes a trial; figures per device are each rank's)"),
        ("global tokens/s", f"{format_rate(summary.best.figure)}  (every rank's real tokens / the slowest window)"),
        ("per-device tokens/s", format_rate(summary.best.figure / n if summary.best.figure else None)),
        ("scaling efficiency", scaling),
        (
            "straggler ratio",
            f"{m.straggler_ratio:.3f}  (slowest rank's window / fastest's)" if m.straggler_ratio else "n/a",
        ),
        ("data wait per rank", waits),
        (
            "rank start",
            f"{start:.1f} s launch to the slowest rank's entry, {m.phase_s.get('rank_imports', 0.0):.1f} s imports, "
            f"{m.phase_s.get('rank_rendezvous', 0.0):.1f} s rendezvous"
            if start is not None
            else "n/a",
        ),
    ]


def ranks_json(summary) -> dict[str, Any]:
    """The same, for --json (absent for one process)."""
    m = summary.best.measurement if summary.best is not None else None
    if m is None or m.world_size <= 1:
        return {}
    figure = summary.best.figure
    return {
        "world_size": m.world_size,
        "global_tokens_per_sec": figure,
        "per_device_tokens_per_sec": figure / m.world_size if figure else None,
        "scaling_efficiency": summary.scaling_efficiency,
        "single_rank_reference": summary.single_rank,
        "straggler_ratio": m.straggler_ratio,
    }


def _leader_rows(summary) -> list[tuple[str, str]]:
    """When the leaders were re-measured together: each one's runs and mean (the best mean won)."""
    remeasured = [c for c in summary.leaders if c.remeasured]
    if len(remeasured) < 2:
        return []
    return [
        (
            f"re-measured #{c.number}",
            f"mean {format_rate(c.mean)} over {'/'.join(format_rate(v) for v in c.values)}"
            + ("  <- best mean" if c.number == summary.best.number else ""),
        )
        for c in remeasured
    ]


def search_summary(result) -> str:
    summary = result.summary
    lines = [
        f"study {printable(summary.name)}: {len(summary.trials)} trials ({counts_text(summary.counts)}); "
        f"memory limit {format_bytes(result.task.memory_limit_bytes)}"
    ]
    generation = is_generation(summary)
    for name, ref in (("baseline", summary.baseline), ("cure" if generation else "checklist", summary.checklist)):
        if ref is not None:
            rate = flag_unstable(format_rate(ref.figure), ref.unstable)
            lines.append(f"{name:<10} #{ref.number}: {rate} tok/s ({ref.status})")
    skipped = summary.counts.get(outcomes.PREDICTED_OVER_LIMIT, 0)
    if skipped:
        lines.append(
            f"skipped {skipped} configuration{'s' if skipped != 1 else ''} predicted over the memory limit by the "
            "study's own trials (not run; `autotune show` gives each one's basis; --no-memory-model runs them)"
        )
    stages = getattr(result, "stages", None)
    if stages:
        lines.append("trials by stage: " + ", ".join(f"{name} {count}" for name, count in stages.items()))
    stopped = getattr(result, "stopped", None)
    if stopped is not None:
        lines.append(f"stopped: {stopped.text}")
    if summary.best is not None:
        lines += ["", best_table(summary)]
        if generation:
            lines += ["", front_text(summary.trials)]
        if summary.best.unstable:
            lines.append(
                f"\nthe best, #{summary.best.number}, was measured UNSTABLE (its step times varied): "
                "check the recipe with `autotune verify` on a quiet machine"
            )
    else:
        lines.append(summary.no_best_reason)
    lines.append("")
    show = f"autotune show --study {printable(summary.name)}"
    if result.storage_url != default_storage_url(summary.name):
        show += " --storage URL"
    lines.append(f"storage: {printable(redact(result.storage_url))}  (the same command resumes it; {show})")
    if result.recipe_path:
        lines.append(f"recipe: {printable(result.recipe_path)}")
    return "\n".join(lines)


def _trial_json(trial: TrialRecord) -> dict[str, Any]:
    return {
        "number": trial.number,
        "state": trial.state.name,
        "outcome": trial.outcome,
        "reason": trial.reason,
        "reference": trial.reference,
        "proposed_by": trial.proposed_by,
        "config": trial.config,
        "tokens_per_sec": trial.figure,  # what the recipe records: the mean of its runs
        "tokens_per_sec_runs": list(trial.runs),
        "tokens_per_sec_ci95": trial.figure_ci95,  # the interval of tokens_per_sec, the mean of its runs
        "joules_per_token": trial.measurement.joules_per_token if trial.measurement else None,
        "peak_memory_bytes": trial.peak_memory_bytes,
        "unstable": trial.unstable,
        "feasible": trial.feasible,
        "broken_bounds": trial.broken_bounds,
        "memory_constraint": trial.memory_constraint,
        "duplicate_of": trial.duplicate_of,
        "predicted_peak_memory_bytes": trial.predicted_peak_memory_bytes,
    }


def summary_json(result) -> dict[str, Any]:
    s = result.summary
    return {
        "study": s.name,
        "storage": redact(result.storage_url),
        "memory_limit_bytes": result.task.memory_limit_bytes,
        "device": result.task.device.to_dict(),
        "counts": s.counts,
        "best": _trial_json(s.best) | {"measurement": s.best.measurement.to_dict() if s.best.measurement else None}
        if s.best
        else None,
        "baseline": _trial_json(s.baseline) if s.baseline else None,
        "checklist": _trial_json(s.checklist) if s.checklist else None,
        **speedup_json(s),
        **ranks_json(s),
        "leaders": [
            {
                "trial": c.number,
                "interval": c.interval,
                "remeasured": c.remeasured,
                "runs": list(c.values),
                "mean": c.mean,
            }
            for c in s.leaders
        ],
        "recipe": str(result.recipe_path) if result.recipe_path else None,
        "n_trials": len(s.trials),
        "skipped_predicted_over_limit": s.counts.get(outcomes.PREDICTED_OVER_LIMIT, 0),
        "stages": getattr(result, "stages", None),
        "stopped": result.stopped.to_dict() if getattr(result, "stopped", None) is not None else None,
        **({"task": "generate", "front": front_json(s.trials)} if is_generation(s) else {}),
    }


def _ranked(summary) -> list[TrialRecord]:
    """The best first (the leaders' re-measurement may have crowned one whose single run is not
    the highest), then every feasible trial by its figure, then the rest."""
    best = summary.best.number if summary.best is not None else None
    return sorted(summary.trials, key=lambda t: (t.number == best, t.feasible, t.figure or 0.0), reverse=True)


def show_text(study, summary, limit: int) -> str:
    about = summary.about
    lines = [
        f"study {printable(study.study_name)}: model {printable(about.model)} on "
        f"{printable(about.hardware.get('name', '?'))}, "
        f"memory limit {format_bytes(about.memory_limit_bytes)}",
        f"trials: {len(summary.trials)} ({counts_text(summary.counts)})",
        "",
    ]
    for trial in _ranked(summary)[:limit]:
        lines.append(trial_line(trial))
    if summary.best is not None:
        lines += ["", best_table(summary)]
        if is_generation(summary):
            lines += ["", front_text(summary.trials)]
    else:
        lines.append("\n" + summary.no_best_reason)
    return "\n".join(lines)


def show_json(study, summary) -> dict[str, Any]:
    s = summary
    return {
        "study": study.study_name,
        "model": s.about.model,
        "hardware": s.about.hardware or None,
        "memory_limit_bytes": s.about.memory_limit_bytes,
        "counts": s.counts,
        "best": _trial_json(s.best) if s.best else None,
        **speedup_json(s),
        "trials": [_trial_json(t) for t in _ranked(s)],
        **({"task": "generate", "front": front_json(s.trials)} if is_generation(s) else {}),
    }


# --- verify and profile -------------------------------------------------------------------------


def format_verify(result: dict[str, Any], path: str) -> str:
    rec, mea = result["recorded"], result["measured"]
    ratio = format_ratio
    rows = [
        (
            "tokens/s",
            flag_unstable(format_rate(rec.get("tokens_per_sec")), rec.get("unstable")),
            flag_unstable(format_rate(mea.get("tokens_per_sec")), mea.get("unstable")),
            ratio(result["ratio_tokens_per_sec"]),
        ),
        (
            "peak memory",
            format_bytes(rec.get("peak_memory_bytes")),
            format_bytes(mea.get("peak_memory_bytes")),
            ratio(result["ratio_peak_memory"]),
        ),
    ]
    if rec.get("memory_limit_bytes") is not None:
        rows.append(("memory limit", format_bytes(rec["memory_limit_bytes"]), "", ""))
    verdict = "PASS" if result["passed"] else "FAIL"
    tol = f"{100 * result['tolerance']:g}%"
    lines = [
        f"verify {printable(path)}: outcome {result['outcome']}",
        table(("", "recorded", "measured", "ratio"), rows),
        "",
    ]
    lines.append(
        f"{verdict}"
        + (f" ({printable(result['reason'])})" if result["reason"] else f" (within {tol} of the recorded tokens/s)")
    )
    return "\n".join(lines)


def format_profile(report) -> str:
    from autotune.measure.profile import CATEGORIES, CATEGORY_LABELS

    per_step = 1000 / report.steps
    head = (
        f"{printable(report.model)} on {printable(report.device_name)}: {report.steps} steps profiled, "
        f"{1000 * report.step_time_s:.1f} ms a step ({report.time_basis})"
    )
    rows = [
        (CATEGORY_LABELS[c], f"{per_step * report.seconds[c]:.2f}", format_pct(report.shares[c])) for c in CATEGORIES
    ]
    ops = [
        (
            op.name,
            CATEGORY_LABELS[op.category],
            f"{per_step * op.self_time_s:.2f}",
            op.calls // report.steps,
            format_pct(op.share),
        )
        for op in report.top_ops
    ]
    warning = (
        [
            f"warning: {report.compiles_in_window} compile event(s) inside the profiled steps: their time is in "
            f"'{CATEGORY_LABELS['compiled']}', not the steady state's; profile again with more --warmup"
        ]
        if report.compiles_in_window
        else []
    )
    return "\n".join(
        [
            head,
            *warning,
            "",
            table(("where", "ms/step", "share"), rows),
            "",
            f"top operators by {report.time_basis}:",
            table(("operator", "category", "ms/step", "calls/step", "share"), ops),
            "",
            f"trace: {printable(report.trace_path)}  (open in https://ui.perfetto.dev or chrome://tracing)",
        ]
    )


# --- the studies a storage holds (show without --study) ------------------------------------------


def studies_text(entries) -> str:
    rows = [
        (e.name, e.model or "?", e.device or "?", e.trials, format_rate(e.best_tokens_per_sec), e.storage)
        for e in entries
    ]
    hint = entries[0]
    command = f"autotune show --study {hint.name}" + ("" if hint.default_storage else f" --storage {hint.storage}")
    command = printable(command)
    return "\n".join(
        [
            f"{len(entries)} stud{'y' if len(entries) == 1 else 'ies'} found:",
            table(("study", "model", "device", "trials", "best tok/s", "storage"), rows),
            "",
            f"show one: {command}",
        ]
    )


def studies_json(entries) -> list[dict[str, Any]]:
    return [
        {
            "study": e.name,
            "storage": e.storage,
            "model": e.model,
            "device": e.device,
            "trials": e.trials,
            "best_tokens_per_sec": e.best_tokens_per_sec,
        }
        for e in entries
    ]


# --- doctor ---------------------------------------------------------------------------------


def matmul_text(matmul: dict[str, Any]) -> str:
    """The doctor's timed matmul: what it reached here, beside the datasheet and a real card."""
    size = matmul["size"]
    if matmul["flops_per_sec"] is None:
        return f"FAILED at {size}x{size}: {matmul['detail']}"
    text = f"{matmul['flops_per_sec'] / 1e12:.3g} TFLOP/s measured here ({size}x{size}"
    if matmul.get("datasheet_flops_per_sec"):
        text += f"; datasheet {matmul['datasheet_flops_per_sec'] / 1e12:g}"
    if matmul.get("measured_elsewhere_flops_per_sec"):
        text += f"; {matmul['measured_elsewhere_flops_per_sec'] / 1e12:g} on a real card of this kind"
    return text + ")"


def doctor_text(report: dict[str, Any]) -> str:
    """`autotune doctor`'s report for people: what was found, then what is wrong."""
    v, d, mem, comp = report["versions"], report["device"], report["memory"], report["compile"]
    driver = f"{v['driver']} (CUDA {v['driver_cuda']}), NVML {v['nvml']}" if v.get("driver") else "none found (no NVML)"
    device = d["name"] if d["kind"] == "cpu" else f"{d['device']}: {d['name']} ({d['uuid']})"
    rows = [
        ("torch", f"{v['torch']}" + (f" (CUDA {v['torch_cuda']})" if v.get("torch_cuda") else " (no CUDA)")),
        ("driver", driver),
        ("triton", v.get("triton") or "not installed"),
        ("python", v["python"]),
        ("device", device),
    ]
    if d["kind"] == "cuda":
        rows += [
            ("memory", format_bytes(d.get("total_memory_bytes"))),
            ("compute capability", d.get("compute_capability") or "?"),
            ("MIG", d.get("mig")),
        ]
        if mem.get("in_container") is not None:
            rows.append(("container", "yes (NVML reports host PIDs)" if mem["in_container"] else "no"))
    rows.append(("peak memory read as", f"{mem['source']}: {mem['detail']}"))
    rows.append(
        ("torch.compile", ("works" if comp["ok"] else "FAILS: " + comp["detail"]) + f" ({comp['seconds']:.1f} s)")
    )
    for dtype, backends in report["sdpa"].items():
        runs = [b for b, r in backends.items() if r == "runs"]
        rows.append((f"SDPA {dtype}", ", ".join(runs) or "none"))
    peak = report["peak_flops"]
    if peak["by_dtype"]:
        figures = ", ".join(f"{k} {v / 1e12:g}" for k, v in peak["by_dtype"].items())
        rows.append(("peak TFLOP/s", f"{figures} ({peak['source']})"))
    else:
        rows.append(("peak TFLOP/s", f"n/a ({peak['source']})"))
    rows.append((f"matmul {report['matmul']['dtype']}", matmul_text(report["matmul"])))
    lines = [f"  {name:<22}{value}" for name, value in rows]
    lines += ["", "warnings:"] + [f"  - {w}" for w in report["warnings"]] if report.get("warnings") else []
    if report["problems"]:
        lines += ["", "problems:"] + [f"  - {p}" for p in report["problems"]]
    else:
        lines += ["", "ok: this machine can run a study"]
    return "\n".join(lines)
