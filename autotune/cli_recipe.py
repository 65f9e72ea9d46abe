"""`autotune verify` and `autotune profile`: the commands that run a recipe file.

Registered on the `autotune` group at the end of autotune/cli.py, which this module imports
for the shared decorators: import the commands through `autotune.cli`, not this module first."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import click

from autotune.cli import CONTEXT_SETTINGS, emit_json, handle_errors
from autotune.errors import UsageError

DEFAULT_VERIFY_TIMEOUT_S = 1800.0


def parse_tolerance(text: str) -> float:
    """"5%" or "0.05" -> 0.05; a fraction in [0, 1)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(%?)\s*", str(text))
    if not match:
        raise UsageError(f"--tolerance: cannot read {text!r}; expected a fraction like 0.05 or a percentage like 5%")
    value = float(match.group(1)) / (100 if match.group(2) else 1)
    if not 0 <= value < 1:
        raise UsageError(f"--tolerance: {text!r} is not between 0 and 100%")
    return value


def load_recipe(path: str, device: str):
    """The recipe, with the one "measured elsewhere" warning as a single stderr line."""
    from autotune.recipe import Recipe

    recipe = Recipe.load(path, check_environment=False)
    diffs = recipe.differences_from_here(device)
    if diffs:
        click.echo("Warning: this recipe was measured elsewhere: " + "; ".join(diffs), err=True)
    return recipe


def _resolve(device: str) -> str:
    from autotune.device import resolve_device

    return resolve_device(device)


# --------------------------------------------------------------------------- verify


@click.command(context_settings=CONTEXT_SETTINGS)
@click.argument("recipe_path", metavar="RECIPE", type=click.Path(dir_okay=False))
@click.option("--device", default="auto", show_default=True, help="auto (CUDA when present), cpu, cuda or cuda:N.")
@click.option("--tolerance", default=None,
              help="Pass when measured tokens/s >= (1 - tolerance) x recorded; 5% or 0.05. Default: 5% on a GPU, "
                   "15% on a CPU, whose run-to-run spread is larger (see README, measurement fidelity).")
@click.option("--steps", type=int, default=20, show_default=True, help="Timed steps.")
@click.option("--warmup", type=int, default=3, show_default=True, help="Warm-up steps (compile happens here).")
@click.option("--data", default=None, help="Data to measure on (default: the recipe's).")
@click.option("--timeout", "timeout_s", type=float, default=DEFAULT_VERIFY_TIMEOUT_S, show_default=True,
              help="Seconds before the measuring process is killed.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@handle_errors
def verify(recipe_path, device, tolerance, steps, warmup, data, timeout_s, as_json) -> None:
    """Re-measure RECIPE here, in a fresh process, with the same measuring core as search,
    and compare with what it recorded. Exit 0: PASS, 1: FAIL."""
    device = _resolve(device)
    tol = parse_tolerance(tolerance) if tolerance is not None else default_tolerance(device)
    recipe = load_recipe(recipe_path, device)
    result = verify_recipe(recipe, device=device, tolerance=tol, steps=steps, warmup=warmup, data=data,
                           timeout_s=timeout_s)
    if as_json:
        emit_json(result)
    else:
        click.echo(format_verify(result, recipe_path))
    sys.exit(0 if result["passed"] else 1)


# A GPU step is long and steady: a recipe should reproduce within a few percent. On a CPU,
# fresh processes of the same configuration spread by 6-12% (coefficient of variation, 2-core
# VM, benchmarks/fidelity.py), so 5% would fail a faithful recipe about half the time.
GPU_TOLERANCE, CPU_TOLERANCE = 0.05, 0.15


def default_tolerance(device: str) -> float:
    return CPU_TOLERANCE if device.split(":", 1)[0] == "cpu" else GPU_TOLERANCE


def verify_recipe(recipe, *, device: str, tolerance: float, steps: int, warmup: int, data: str | None = None,
                  timeout_s: float = DEFAULT_VERIFY_TIMEOUT_S) -> dict[str, Any]:
    """Measure the recipe's config with runner.run_trial and judge it against the record."""
    from autotune.config import RunSpec
    from autotune.device import describe
    from autotune.models import check_model_name
    from autotune.recipe import recipe_measured
    from autotune.runner import run_trial

    recorded = dict(recipe.measured)
    recorded_tps = recorded.get("tokens_per_sec")
    if not isinstance(recorded_tps, (int, float)) or recorded_tps <= 0:
        raise UsageError("the recipe records no tokens_per_sec (measured.tokens_per_sec): nothing to verify against")
    name = recipe.model.get("name")
    if not name:
        raise UsageError("the recipe names no model (model.name)")
    check_model_name(str(name))
    data = data or recipe.data or "synthetic"
    if data != "synthetic" and not Path(data).is_file():
        raise UsageError(f"the recipe was measured on {data}, which is not here; give --data PATH (or synthetic)")
    limit = recorded.get("memory_limit_bytes")
    seq_len = recipe.model.get("seq_len")
    spec = RunSpec(model=str(name), device=device, data=data, seq_len=seq_len if isinstance(seq_len, int) else None,
                   warmup=warmup, steps=steps, memory_limit_bytes=limit if isinstance(limit, int) else None)
    trial = run_trial(spec, recipe.config, timeout_s=timeout_s, device=describe(device))
    m = trial.measurement or {}
    measured = recipe_measured(m, spec.memory_limit_bytes) if m else {}
    tps, peak = measured.get("tokens_per_sec"), measured.get("peak_memory_bytes")
    recorded_peak = recorded.get("peak_memory_bytes")
    ratio_tps = tps / recorded_tps if tps is not None else None
    ratio_peak = peak / recorded_peak if peak is not None and recorded_peak else None

    reasons = []
    if trial.outcome not in ("ok", "over_memory_limit"):
        reasons.append(f"the run ended {trial.outcome}" + (f": {trial.reason.splitlines()[0]}" if trial.reason else ""))
    if tps is not None and tps < (1 - tolerance) * recorded_tps:
        reasons.append(f"tokens/s is {ratio_tps:.2f}x the recorded, below the {1 - tolerance:.2f}x allowed")
    if spec.memory_limit_bytes is not None and peak is not None and peak > spec.memory_limit_bytes:
        from autotune.outcomes import format_bytes

        reasons.append(f"peak memory {format_bytes(peak)} is above the limit {format_bytes(spec.memory_limit_bytes)}")
    return {
        "recorded": recorded,
        "measured": measured,
        "ratio_tokens_per_sec": ratio_tps,
        "ratio_peak_memory": ratio_peak,
        "tolerance": tolerance,
        "passed": not reasons and tps is not None,
        "outcome": trial.outcome,
        "reason": "; ".join(reasons) or None,
    }


def format_verify(result: dict[str, Any], path: str) -> str:
    from autotune.outcomes import format_bytes
    from autotune.render import format_rate, table

    rec, mea = result["recorded"], result["measured"]

    def ratio(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.2f}x"

    rows = [
        ("tokens/s", format_rate(rec.get("tokens_per_sec")), format_rate(mea.get("tokens_per_sec")),
         ratio(result["ratio_tokens_per_sec"])),
        ("peak memory", format_bytes(rec.get("peak_memory_bytes")), format_bytes(mea.get("peak_memory_bytes")),
         ratio(result["ratio_peak_memory"])),
    ]
    if rec.get("memory_limit_bytes") is not None:
        rows.append(("memory limit", format_bytes(rec["memory_limit_bytes"]), "", ""))
    verdict = "PASS" if result["passed"] else "FAIL"
    tol = f"{100 * result['tolerance']:g}%"
    lines = [f"verify {path}: outcome {result['outcome']}", table(("", "recorded", "measured", "ratio"), rows), ""]
    lines.append(f"{verdict}" + (f" ({result['reason']})" if result["reason"] else f" (within {tol} of the recorded tokens/s)"))
    return "\n".join(lines)


# -------------------------------------------------------------------------- profile


@click.command(context_settings=CONTEXT_SETTINGS)
@click.argument("recipe_path", metavar="RECIPE", type=click.Path(dir_okay=False))
@click.option("--device", default="auto", show_default=True, help="auto (CUDA when present), cpu, cuda or cuda:N.")
@click.option("--steps", type=click.IntRange(min=1), default=10, show_default=True, help="Profiled steps.")
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True,
              help="Unprofiled warm-up steps (compile happens here).")
@click.option("--data", default="synthetic", show_default=True, help="synthetic, or a .bin/.txt/.jsonl file.")
@click.option("--out", "out_dir", default=None, help="Directory for trace.json (default: profiles/<recipe name>).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@handle_errors
def profile(recipe_path, device, steps, warmup, data, out_dir, as_json) -> None:
    """Profile RECIPE's training step: where the time goes (data wait, attention, matmuls,
    elementwise, optimizer) and a Chrome trace for Perfetto or chrome://tracing."""
    from autotune.profiling import profile_recipe

    device = _resolve(device)
    recipe = load_recipe(recipe_path, device)
    out = out_dir or str(Path("profiles") / Path(recipe_path).stem)
    report = profile_recipe(recipe, device=device, steps=steps, warmup=warmup, out_dir=out, data=data)
    if as_json:
        emit_json(report.to_dict())
    else:
        click.echo(format_profile(report))


def format_profile(report) -> str:
    from autotune.profiling import CATEGORIES, CATEGORY_LABELS
    from autotune.render import format_pct, table

    per_step = 1000 / report.steps
    head = (f"{report.model} on {report.device_name}: {report.steps} steps profiled, "
            f"{1000 * report.step_time_s:.1f} ms a step ({report.time_basis})")
    rows = [(CATEGORY_LABELS[c], f"{per_step * report.seconds[c]:.2f}", format_pct(report.shares[c]))
            for c in CATEGORIES]
    ops = [(op.name, CATEGORY_LABELS[op.category], f"{per_step * op.self_time_s:.2f}", op.calls // report.steps,
            format_pct(op.share)) for op in report.top_ops]
    return "\n".join([
        head, "",
        table(("where", "ms/step", "share"), rows), "",
        f"top operators by {report.time_basis}:",
        table(("operator", "category", "ms/step", "calls/step", "share"), ops), "",
        f"trace: {report.trace_path}  (open in https://ui.perfetto.dev or chrome://tracing)",
    ])
