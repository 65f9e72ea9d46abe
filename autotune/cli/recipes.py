"""Commands that take a recipe: `export`, `verify` and `profile`."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from autotune.cli._options import (
    CONTEXT_SETTINGS,
    FRACTION,
    device_option,
    emit_json,
    json_option,
    min_time_option,
    steps_option,
    study_options,
    warmup_option,
)
from autotune.errors import UsageError


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


@click.command(context_settings=CONTEXT_SETTINGS)
@click.argument("recipe_file", required=False, type=click.Path(dir_okay=False))
@study_options
@click.option(
    "-o",
    "--output",
    default=None,
    help="Write here instead of standard output (a study's recipe: default recipes/<study>.json).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["json", "yaml", "hf", "hf-json", "lightning", "lightning-json"]),
    default="json",
    show_default=True,
    help="json/yaml: the recipe; hf: TrainingArguments kwargs as Python, hf-json as JSON; lightning: Trainer "
    "and DataLoader kwargs as Python, lightning-json as JSON. Field names follow the installed library, "
    "and are checked by constructing its object when it is installed.",
)
def export(recipe_file, study, storage, output, fmt) -> None:
    """Export a recipe (a file, or the best of a stored study) as JSON, YAML, Hugging Face or Lightning settings."""
    from autotune.recipe import Recipe

    if (recipe_file is None) == (study is None and storage is None):
        raise UsageError("give either a RECIPE file or --study (with --storage when not the default)")
    if recipe_file:
        recipe = Recipe.load(recipe_file)
    else:
        from autotune.search.best import best_recipe
        from autotune.search.storage import default_storage_url, load_study

        loaded = load_study(study, storage)
        recipe = best_recipe(loaded, storage or default_storage_url(loaded.study_name))
        if output is None and fmt == "json":
            output = str(Path("recipes") / f"{loaded.study_name}.json")
    if fmt == "json" and output:
        path = recipe.save(output)
        click.echo(f"wrote {path}")
        return
    from autotune.recipe.export import render

    text = render(recipe, fmt)
    if output:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        Path(output).write_text(text, encoding="utf-8")
        click.echo(f"wrote {output}")
    else:
        click.echo(text, nl=not text.endswith("\n"))


@click.command(context_settings=CONTEXT_SETTINGS)
@click.argument("recipe_path", metavar="RECIPE", type=click.Path(dir_okay=False))
@device_option
@click.option(
    "--tolerance",
    type=FRACTION,
    default=None,
    help="Pass when measured tokens/s >= (1 - tolerance) x recorded; 5% or 0.05. Default: 5% on a GPU, "
    "15% on a CPU, whose run-to-run spread is larger (see README, measurement fidelity).",
)
@steps_option
@warmup_option
@min_time_option
@click.option("--data", default=None, help="Data to measure on (default: the recipe's).")
@click.option(
    "--timeout",
    "timeout_s",
    type=float,
    default=1800.0,
    show_default=True,
    help="Seconds before the measuring process is killed.",
)
@json_option
def verify(recipe_path, device, tolerance, steps, warmup, min_time, data, timeout_s, as_json) -> None:
    """Re-measure RECIPE here, in a fresh process, with the same measuring core as search,
    and compare with what it recorded. Exit 0: PASS, 1: FAIL."""
    from autotune.present.summaries import format_verify
    from autotune.recipe.verify import default_tolerance, verify_recipe

    device = _resolve(device)
    tol = tolerance if tolerance is not None else default_tolerance(device)
    recipe = load_recipe(recipe_path, device)
    result = verify_recipe(
        recipe,
        device=device,
        tolerance=tol,
        steps=steps,
        warmup=warmup,
        min_time_s=min_time,
        data=data,
        timeout_s=timeout_s,
    )
    if as_json:
        emit_json(result)
    else:
        click.echo(format_verify(result, recipe_path))
    sys.exit(0 if result["passed"] else 1)


@click.command(context_settings=CONTEXT_SETTINGS)
@click.argument("recipe_path", metavar="RECIPE", type=click.Path(dir_okay=False))
@device_option
@steps_option
@warmup_option
@click.option("--data", default="synthetic", show_default=True, help="synthetic, or a .bin/.txt/.jsonl file.")
@click.option("--out", "out_dir", default=None, help="Directory for trace.json (default: profiles/<recipe name>).")
@json_option
def profile(recipe_path, device, steps, warmup, data, out_dir, as_json) -> None:
    """Profile RECIPE's training step: where the time goes (data wait, attention, matmuls,
    elementwise, optimizer) and a Chrome trace for Perfetto or chrome://tracing."""
    from autotune.present.summaries import format_profile
    from autotune.recipe.profile import profile_recipe

    device = _resolve(device)
    recipe = load_recipe(recipe_path, device)
    out = out_dir or str(Path("profiles") / Path(recipe_path).stem)
    report = profile_recipe(recipe, device=device, steps=steps, warmup=warmup, out_dir=out, data=data)
    if as_json:
        emit_json(report.to_dict())
    else:
        click.echo(format_profile(report))
