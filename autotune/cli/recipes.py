"""Commands that take a recipe: `export`, `verify` and `profile`."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from autotune.cli._options import (
    CONTEXT_SETTINGS,
    FRACTION,
    emit_json,
    json_option,
    say,
    settings_options,
    stdout_to_stderr,
    study_options,
)
from autotune.device.disk import check_output_folder, check_writable, write_text_atomic
from autotune.errors import UsageError, printable
from autotune.search.settings import SearchSettings

# What verify and profile mean by an option of `search` (search.settings) where it differs: named
# overrides of its one declaration, never a copy (tests/cli/test_shared_options.py).
RECIPES_MODEL = {
    "default": None,
    "help": "Build this model instead of the one the recipe names (gpt2, ..., or package.module:factory).",
}
RECIPES_DATA = {"default": None, "help": "Data to measure on (default: the recipe's)."}
PROFILED_STEPS = {"minimum": 1, "help": "Profiled steps."}  # no spread is taken: one step will do
VERIFY_TIMEOUT = {
    "default": 1800.0,
    "show_default": True,
    "help": "Kill the measuring process after this long (seconds, or e.g. 30m).",
}

allow_model_import_option = click.option(
    "--allow-model-import",
    is_flag=True,
    help="Let the recipe's own package.module:factory model be imported and run (only for recipes you "
    "trust: it is code). Without it such a recipe is refused; autotune's own models need nothing.",
)


def load_recipe(path: str, device: str):
    """The recipe, with the one "measured elsewhere" warning as a single stderr line."""
    from autotune.recipe import Recipe

    recipe = Recipe.load(path, check_environment=False)
    diffs = recipe.differences_from_here(device)
    if diffs:
        click.echo(printable("Warning: this recipe was measured elsewhere: " + "; ".join(diffs)), err=True)
    return recipe


DEFAULT_PROBE_TIMEOUT_S = 300.0  # building a user's model, in a child process, before anything else


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
    type=click.Choice(
        [
            "json",
            "yaml",
            "hf",
            "hf-json",
            "lightning",
            "lightning-json",
            "env",
            "torchrun",
            "hf-generate",
            "hf-generate-json",
            "decode-loop",
        ]
    ),
    default="json",
    show_default=True,
    help="json/yaml: the recipe; hf: TrainingArguments kwargs as Python, hf-json as JSON; lightning: Trainer "
    "and DataLoader kwargs as Python, lightning-json as JSON. Field names follow the installed library, "
    "and are checked by constructing its object when it is installed. env: the shell exports to run before "
    "training starts CUDA (the allocator's expandable_segments). torchrun: the shell that launches a recipe "
    "of N ranks (torchrun --standalone --nproc-per-node N train.py, OMP_NUM_THREADS per rank). A generation "
    "recipe: hf-generate, its GenerationConfig and generate call as Python (hf-generate-json as JSON); "
    "decode-loop, a plain PyTorch decode loop with its settings.",
)
def export(recipe_file, study, storage, output, fmt) -> None:
    """Export a recipe (a file, or the best of a stored study) as JSON, YAML, Hugging Face or Lightning settings."""
    if (recipe_file is None) == (study is None and storage is None):
        raise UsageError("give either a RECIPE file or --study (with --storage when not the default)")
    if recipe_file:
        recipe = load_recipe(recipe_file, None)  # where it was measured, in one escaped line as verify says it
    else:
        from autotune.recipe.from_study import best_recipe
        from autotune.study.storage import load_study
        from autotune.study.urls import check_study_name, default_storage_url

        loaded = load_study(study, storage)
        recipe = best_recipe(loaded, storage or default_storage_url(loaded.study_name))
        if output is None and fmt == "json":
            output = str(Path("recipes") / f"{check_study_name(loaded.study_name)}.json")
    if output:
        check_writable(output, what="output", create_folders=True)
    if fmt == "json" and output:
        path = recipe.save(output)
        click.echo(f"wrote {printable(path)}")
        return
    from autotune.integrations.export import render

    text = render(recipe, fmt)
    if output:
        write_text_atomic(output, text, what="output")
        click.echo(f"wrote {printable(output)}")
    else:
        click.echo(printable(text, newlines=True), nl=not text.endswith("\n"))


@click.command(context_settings=CONTEXT_SETTINGS)
@click.argument("recipe_path", metavar="RECIPE", type=click.Path(dir_okay=False))
@settings_options(SearchSettings, "device")
@click.option(
    "--tolerance",
    type=FRACTION,
    default=None,
    help="Pass when measured tokens/s >= (1 - tolerance) x recorded; 5% or 0.05. Default: 5% on a GPU, "
    "15% on a CPU, whose run-to-run spread is larger (see docs/benchmarks.md, measurement fidelity).",
)
@settings_options(
    SearchSettings, "steps", "warmup", "min_time_s", "data", "timeout_s", data=RECIPES_DATA, timeout_s=VERIFY_TIMEOUT
)
@click.option(
    "--soak",
    is_flag=True,
    help="Run the recipe for one full epoch of the data's batches (every batch shape), or --steps N, and "
    "report throughput and peak memory per window; FAIL when memory is above the limit less the recipe's "
    "headroom, or still grows in the second half at a rate that would reach it within 10x the run.",
)
@click.option(
    "--from",
    "run_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Judge RUN.json, a report of your own training run (recipe.meter, autotune_meter.json), against the "
    "recipe instead of measuring here; the tolerance's default is that of the device the run was metered on.",
)
@settings_options(SearchSettings, "model", model=RECIPES_MODEL)
@allow_model_import_option
@json_option
@click.pass_context
def verify(
    ctx,
    recipe_path,
    run_file,
    device,
    tolerance,
    steps,
    warmup,
    min_time_s,
    data,
    timeout_s,
    soak,
    model,
    allow_model_import,
    as_json,
) -> None:
    """Re-measure RECIPE here, in a fresh process, with the same measuring core as search,
    and compare with what it recorded (--soak: run it long, and watch its memory).
    Exit 0: PASS, 1: FAIL, 2: bad input, 130: Ctrl-C."""
    from autotune.present.summaries import format_verify
    from autotune.recipe.verify import default_tolerance, verify_recipe

    if run_file is not None:
        _verify_run_file(ctx, recipe_path, run_file, tolerance, soak, as_json)
    device = _resolve(device)
    if soak and load_recipe(recipe_path, device).task != "train":
        raise UsageError("--soak runs a training recipe for an epoch; a generation recipe is verified without it")
    if soak:
        from autotune.present.soak_report import format_soak
        from autotune.recipe.soak_check import soak_recipe

        given = ctx.get_parameter_source("steps") is not click.core.ParameterSource.DEFAULT
        result = soak_recipe(
            load_recipe(recipe_path, device),
            device=device,
            steps=steps if given else None,  # one epoch unless --steps
            warmup=warmup,
            data=data,
            timeout_s=timeout_s,
            model=model,
            allow_model_import=allow_model_import,
        )
        emit_json(result) if as_json else say(format_soak(result, recipe_path))
        sys.exit(0 if result["passed"] else 1)
    tol = tolerance if tolerance is not None else default_tolerance(device)
    recipe = load_recipe(recipe_path, device)
    result = verify_recipe(
        recipe,
        device=device,
        tolerance=tol,
        steps=steps,
        warmup=warmup,
        min_time_s=min_time_s,
        data=data,
        timeout_s=timeout_s,
        model=model,
        allow_model_import=allow_model_import,
    )
    if as_json:
        emit_json(result)
    else:
        say(format_verify(result, recipe_path))
    sys.exit(0 if result["passed"] else 1)


def _verify_run_file(ctx, recipe_path: str, run_file: str, tolerance: float | None, soak: bool, as_json: bool) -> None:
    """`verify --from RUN.json`: nothing runs; the report is judged and verify's table printed."""
    from autotune.config import JsonProblem, load_json
    from autotune.present.summaries import format_verify
    from autotune.recipe.verify import verify_run_file

    measuring = [name for name in ("steps", "warmup", "min_time_s", "data", "model") if _given(ctx, name)]
    if soak or measuring:
        raise UsageError(f"--from judges a run already made: --{(['soak'] if soak else measuring)[0]} measures one")
    from autotune.recipe import Recipe

    recipe = Recipe.load(recipe_path, check_environment=False)  # the run, not this machine, was metered
    if recipe.task != "train":
        raise UsageError("--from judges a training run: this is a generation recipe")
    try:
        run = load_json(Path(run_file).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, JsonProblem, ValueError) as exc:
        raise UsageError(f"--from {printable(run_file)}: {printable(str(exc))[:200]}") from None
    result = verify_run_file(recipe, run, tolerance=tolerance)
    if as_json:
        emit_json(result)
    else:
        say(format_verify(result, recipe_path) + f"\nthe meter: {printable(result['verdict'])}")
    sys.exit(0 if result["passed"] else 1)


def _given(ctx, name: str) -> bool:
    return ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT


@click.command(context_settings=CONTEXT_SETTINGS)
@click.argument("recipe_path", metavar="RECIPE", type=click.Path(dir_okay=False))
@settings_options(SearchSettings, "device", "steps", "warmup", "data", steps=PROFILED_STEPS)
@click.option("--out", "out_dir", default=None, help="Directory for trace.json (default: profiles/<recipe name>).")
@settings_options(SearchSettings, "model", model=RECIPES_MODEL)
@allow_model_import_option
@json_option
def profile(recipe_path, device, steps, warmup, data, out_dir, model, allow_model_import, as_json) -> None:
    """Profile RECIPE's training step: where the time goes (data wait, attention, matmuls,
    elementwise, optimizer) and a Chrome trace for Perfetto or chrome://tracing."""
    from autotune.config import check_runnable_here
    from autotune.measure.profile import TRACE_NAME
    from autotune.present.summaries import format_profile
    from autotune.recipe.profile import profile_recipe
    from autotune.recipe.verify import check_recipe_runs

    device = _resolve(device)
    recipe = load_recipe(recipe_path, device)
    if recipe.task != "train":
        raise UsageError("profile runs a training recipe's step; for a generation recipe use bench --task generate")
    name = recipe.model_to_run(model, allow_import=allow_model_import)
    check_runnable_here(recipe.config, where=f"recipe {recipe_path}: config")
    out = out_dir or str(Path("profiles") / Path(recipe_path).stem)
    check_output_folder(out, (TRACE_NAME,), what="--out")  # before anything runs
    # Its blocks and seq_len against the model, and the data: a user's model is built in a child
    # first (as bench: it is profiled in this process).
    check_recipe_runs(
        recipe,
        name,
        data=data,
        data_from_recipe=False,
        timeout_s=DEFAULT_PROBE_TIMEOUT_S,
        host_limit_bytes=None,
    )
    with stdout_to_stderr(as_json):  # the model's prints: stdout is for the JSON alone
        report = profile_recipe(
            recipe, device=device, steps=steps, warmup=warmup, out_dir=out, data=data, model_name=name
        )
    if as_json:
        emit_json(report.to_dict())
    else:
        say(format_profile(report))
