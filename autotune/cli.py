"""The `autotune` command line. Commands are thin: they parse, call the library, print.
Errors from the library become one line on stderr and an exit code (2: bad input)."""

from __future__ import annotations

import functools
import json
import logging
import sys
from typing import Any, Callable

import click

from autotune import __version__
from autotune.errors import AutotuneError

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def handle_errors(command: Callable) -> Callable:
    """Turn autotune's exceptions into `Error: <one line>` and the error's exit code."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except AutotuneError as exc:
            click.echo(f"Error: {exc}", err=True)
            sys.exit(exc.exit_code)

    return wrapper


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


@click.group(context_settings=CONTEXT_SETTINGS)
@click.version_option(__version__, "-V", "--version", prog_name="autotune")
@click.option("-v", "--verbose", is_flag=True, help="Log what autotune decides (tokenizer, NVML, ...).")
def main(verbose: bool) -> None:
    """Find the fastest way to train a GPT-2-class model on this machine, within a memory
    limit, and hand it back as a recipe."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


def run_options(command: Callable) -> Callable:
    """Options shared by every command that runs the model: what to run and on what."""
    options = [
        click.option("--model", default="gpt2-tiny", show_default=True,
                     help="gpt2, gpt2-medium, gpt2-large, gpt2-xl, gpt2-tiny, or package.module:factory."),
        click.option("--device", default="auto", show_default=True, help="auto (CUDA when present), cpu, cuda or cuda:N."),
        click.option("--data", default="synthetic", show_default=True,
                     help="synthetic, or a PATH.bin (uint16 tokens), PATH.txt or PATH.jsonl file."),
        click.option("--seq-len", type=int, default=None, help="Context length (default: the model's)."),
        click.option("--warmup", type=int, default=3, show_default=True, help="Warm-up steps (compile happens here)."),
        click.option("--steps", type=int, default=20, show_default=True, help="Timed steps (at least)."),
        click.option("--min-time", type=float, default=2.0, show_default=True,
                     help="Time the steps for at least this many seconds too (more steps on a fast device)."),
        click.option("--seed", type=int, default=0, show_default=True, help="Seed for weights and data."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _run_spec(model: str, device: str, data: str, seq_len: int | None, warmup: int, steps: int, min_time: float,
              seed: int, memory_limit: int | None = None):
    from autotune.config import RunSpec
    from autotune.device import resolve_device
    from autotune.models import check_model_name

    check_model_name(model)
    return RunSpec(model=model, device=resolve_device(device), data=data, seq_len=seq_len, warmup=warmup,
                   steps=steps, min_time_s=min_time, seed=seed, memory_limit_bytes=memory_limit)


@main.command(context_settings=CONTEXT_SETTINGS)
@run_options
@click.option("--batching", type=click.Choice(["fixed", "padded", "packed"]), default=None,
              help="Batching mode (same as --set batching=...).")
@click.option("--set", "assignments", multiple=True, metavar="KNOB=VALUE",
              help="Set a knob, e.g. --set amp_dtype=bfloat16 (repeatable).")
@click.option("--memory-limit", default=None, help="Flag the run over_memory_limit above this peak, e.g. 60GiB.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@handle_errors
def bench(model, device, data, seq_len, warmup, steps, min_time, seed, batching, assignments, memory_limit, as_json) -> None:
    """Measure one configuration: effective tokens/s, memory, MFU and their spread.

    Knobs: num_workers, prefetch_factor, pin_memory, persistent_workers, token_budget,
    batching, amp_dtype, compile_mode, sdpa_backend, checkpoint_layers.
    """
    from autotune.config import TrainConfig, parse_assignments, parse_memory_size
    from autotune.measure import measure
    from autotune.render import format_measurement

    overrides = parse_assignments(assignments)
    if batching:
        overrides["batching"] = batching
    limit = parse_memory_size(memory_limit) if memory_limit else None
    spec = _run_spec(model, device, data, seq_len, warmup, steps, min_time, seed, limit)
    result = measure(spec, TrainConfig().with_overrides(overrides))
    if as_json:
        emit_json(result.to_dict())
    else:
        click.echo(format_measurement(result))
    sys.exit(0 if result.outcome == "ok" else 1)


# --- search, show, export ----------------------------------------------------------------------


class _ProgressReporter:
    """A progress bar with the best so far (stderr) and one line per finished trial."""

    def __init__(self, n_trials: int, quiet: bool) -> None:
        from tqdm import tqdm

        self.quiet = quiet
        self.bar = tqdm(total=n_trials, unit="trial", file=sys.stderr, dynamic_ncols=True,
                        disable=quiet or not sys.stderr.isatty())

    def trial_started(self, number: int, cfg) -> None:
        from autotune.render import config_summary

        self.bar.set_description(f"trial {number}")
        if not self.quiet and not self.bar.disable:
            self.bar.write(f"  running #{number}: {config_summary(cfg.to_dict())}", file=sys.stderr)

    def confirming(self, number: int) -> None:
        if not self.quiet:
            self.bar.write(f"confirming the best, #{number}, with one more run (the recipe reports the mean of both)")

    def trial_finished(self, trial, summary) -> None:
        from autotune.render import trial_line

        self.bar.update(1)
        if summary.best is not None:
            self.bar.set_postfix_str(f"best {summary.best.value:,.0f} tok/s (#{summary.best.number})")
        if not self.quiet:
            self.bar.write(trial_line(trial))

    def close(self) -> None:
        self.bar.close()


def _parse_duration(text: str | None, option: str) -> float | None:
    """"90", "90s", "10m", "2h" -> seconds."""
    if text is None:
        return None
    from autotune.errors import UsageError

    units = {"": 1, "s": 1, "m": 60, "h": 3600}
    raw = text.strip().lower()
    number, unit = raw.rstrip("smh"), raw[len(raw.rstrip("smh")):]
    try:
        value = float(number) * units[unit]
    except (ValueError, KeyError):
        raise UsageError(f"{option}: cannot read {text!r} as a duration; expected e.g. 90s, 10m or 2h") from None
    if value <= 0:
        raise UsageError(f"{option}: the duration must be positive, got {text!r}")
    return value


@main.command(context_settings=CONTEXT_SETTINGS)
@run_options
@click.option("--study", default=None, help="Study name (default: <model>-<device slug>, e.g. gpt2-nvidia-h200).")
@click.option("--storage", default=None, envvar="AUTOTUNE_STORAGE", show_envvar=True,
              help="Optuna storage URL (default: sqlite:///studies/<study>.db); journal:PATH for one host, many workers; "
                   "postgresql://... for many hosts (the environment variable keeps a password off the command line).")
@click.option("--space", default=None, help="Search space YAML (default: search_spaces/gpt2.yaml on CUDA, cpu.yaml on CPU).")
@click.option("--memory-limit", default=None, help="Peak memory a configuration may use, e.g. 60GiB (GPU memory via NVML; peak RSS on CPU).")
@click.option("--memory-fraction", type=float, default=None, help="Limit as a fraction of the device's total memory (default 0.9).")
@click.option("--n-trials", type=int, default=20, show_default=True, help="Trials to run in this invocation (reference trials included).")
@click.option("--timeout", default=None, help="Stop starting new trials after this long, e.g. 10m.")
@click.option("--trial-timeout", default=None, help="Kill a trial after this long (default 300s on CPU, 600s on CUDA).")
@click.option("--recipe", "recipe_path", default=None, help="Where to write the best recipe (default: recipes/<study>.json).")
@click.option("--warm-start-from", default=None, help="Start a new study with another study's best configurations (REF: .db path or URL#study).")
@click.option("--devices", default=None, metavar="0,1,...",
              help="One worker per GPU of this host (indices as nvidia-smi lists them, or UUIDs), all on one study; "
                   "--n-trials is then the total. Use journal:PATH or PostgreSQL storage.")
@click.option("--worker", is_flag=True, hidden=True)  # a child of --devices: the parent prints the summary
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable summary instead of tables.")
@handle_errors
def search(model, device, data, seq_len, warmup, steps, min_time, seed, study, storage, space, memory_limit, memory_fraction,
           n_trials, timeout, trial_timeout, recipe_path, warm_start_from, devices, worker, as_json) -> None:
    """Run (or resume) an Optuna study over the search space and write the best recipe.

    Each trial runs in a fresh process and is measured in effective tokens/s; a trial
    whose peak memory breaks the limit is infeasible and can never be the best. Running
    the same command again adds trials to the same study.
    """
    from autotune.config import parse_memory_size
    from autotune.render import search_summary, summary_json
    from autotune.search import SearchInterrupted, SearchSettings, run_search

    if n_trials < 1:
        raise click.BadParameter("must be at least 1", param_hint="--n-trials")
    settings = SearchSettings(
        model=model, device=device, data=data, seq_len=seq_len, study=study, storage=storage, space=space,
        memory_limit_bytes=parse_memory_size(memory_limit) if memory_limit else None,
        memory_fraction=memory_fraction, n_trials=n_trials, timeout_s=_parse_duration(timeout, "--timeout"),
        trial_timeout_s=_parse_duration(trial_timeout, "--trial-timeout"), warmup=warmup, steps=steps, min_time_s=min_time, seed=seed,
        recipe=recipe_path, warm_start_from=warm_start_from,
    )
    reporter = _ProgressReporter(n_trials, quiet=as_json or bool(devices))
    try:
        if devices:
            from autotune.workers import run_workers

            result = run_workers(settings, devices, as_json=as_json)
        else:
            result = run_search(settings, reporter)
    except SearchInterrupted as stop:
        reporter.close()
        if not worker:
            click.echo(search_summary(stop.result), err=True)
        raise
    finally:
        reporter.close()
    if worker:
        return  # the --devices parent prints the summary of the whole study
    for failure in result.worker_failures:
        click.echo(f"Error: {failure}", err=True)
    if as_json:
        emit_json(summary_json(result))
    else:
        click.echo(search_summary(result))
    if result.summary.best is None:
        click.echo(f"Error: {result.summary.no_best_reason}; no recipe written", err=True)
        sys.exit(1)
    if result.worker_failures:
        sys.exit(1)


def study_options(command: Callable) -> Callable:
    command = click.option("--storage", default=None, help="Optuna storage URL or a .db / .journal path.")(command)
    return click.option("--study", default=None, help="Study name.")(command)


@main.command(context_settings=CONTEXT_SETTINGS)
@study_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--limit", type=int, default=20, show_default=True, help="Trials to list (best first).")
@handle_errors
def show(study, storage, as_json, limit) -> None:
    """Show a stored study: its trials (best first), outcome counts and the best."""
    from autotune.render import show_json, show_text
    from autotune.search import load_study
    from autotune.study import summarize

    loaded = load_study(study, storage)
    summary = summarize(loaded)
    if as_json:
        emit_json(show_json(loaded, summary))
    else:
        click.echo(show_text(loaded, summary, limit))


@main.command(context_settings=CONTEXT_SETTINGS)
@click.argument("recipe_file", required=False, type=click.Path(dir_okay=False))
@study_options
@click.option("-o", "--output", default=None, help="Write here instead of standard output (a study's recipe: default recipes/<study>.json).")
@click.option("--format", "fmt", type=click.Choice(["json", "yaml", "hf", "lightning"]), default="json", show_default=True,
              help="json/yaml: the recipe; hf: TrainingArguments kwargs; lightning: Trainer and DataLoader kwargs.")
@handle_errors
def export(recipe_file, study, storage, output, fmt) -> None:
    """Export a recipe (a file, or the best of a stored study) as JSON, YAML, Hugging Face or Lightning settings."""
    from pathlib import Path

    from autotune.errors import UsageError
    from autotune.recipe import Recipe

    if (recipe_file is None) == (study is None and storage is None):
        raise UsageError("give either a RECIPE file or --study (with --storage when not the default)")
    if recipe_file:
        recipe = Recipe.load(recipe_file)
    else:
        from autotune.search import load_study, recipe_from_trial
        from autotune.storage import default_storage_url
        from autotune.study import summarize

        loaded = load_study(study, storage)
        summary = summarize(loaded)
        if summary.best is None:
            raise UsageError(f"study {loaded.study_name!r} has no trial within its memory limit: nothing to export")
        recipe = recipe_from_trial(summary, loaded.user_attrs, loaded.study_name,
                                   storage or default_storage_url(loaded.study_name))
        if output is None and fmt == "json":
            output = str(Path("recipes") / f"{loaded.study_name}.json")
    if fmt == "json" and output:
        path = recipe.save(output)
        click.echo(f"wrote {path}")
        return
    from autotune.export import render

    text = render(recipe, fmt)
    if output:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        Path(output).write_text(text, encoding="utf-8")
        click.echo(f"wrote {output}")
    else:
        click.echo(text, nl=not text.endswith("\n"))


from autotune.cli_recipe import profile, verify  # noqa: E402  (commands live beside their concern)
main.add_command(verify)
main.add_command(profile)


# --- compare, report, dashboard ----------------------------------------------------------------


@main.command(context_settings=CONTEXT_SETTINGS)
@click.argument("refs", nargs=-1, required=True, metavar="REF...")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--markdown", "as_markdown", is_flag=True, help="Print a Markdown table.")
@handle_errors
def compare(refs, as_json, as_markdown) -> None:
    """Compare studies side by side: the same model tuned on two GPUs, say.

    A REF is a storage (PATH.db, PATH.journal, journal:PATH or an Optuna storage URL),
    with #STUDY when the storage holds more than one study:
    studies/gpt2-nvidia-a100.db  or  postgresql://tuner@db/autotune#gpt2-h200.
    Knobs whose best value differs between the studies are marked with *.
    """
    from autotune.compare import comparison_markdown, comparison_text, load_comparison
    from autotune.errors import UsageError

    if as_json and as_markdown:
        raise UsageError("give --json or --markdown, not both")
    comparison = load_comparison(refs)
    if as_json:
        emit_json(comparison.to_dict())
    elif as_markdown:
        click.echo(comparison_markdown(comparison))
    else:
        click.echo(comparison_text(comparison))


@main.command(context_settings=CONTEXT_SETTINGS)
@study_options
@click.option("--out", "out_dir", default=None, help="Folder to write (default: reports/<study>).")
@handle_errors
def report(study, storage, out_dir) -> None:
    """Write a study's figures (PNG), index.html and report.md: readable without Python."""
    from pathlib import Path

    from autotune.report import write_report
    from autotune.search import load_study
    from autotune.storage import default_storage_url, redact

    loaded = load_study(study, storage)
    shown = redact(storage or default_storage_url(loaded.study_name))
    written = write_report(loaded, out_dir or Path("reports") / loaded.study_name, storage=shown)
    for path in [*written.images.values(), written.markdown]:
        click.echo(f"wrote {path}")
    click.echo(f"open {written.html}")


@main.command(context_settings=CONTEXT_SETTINGS)
@study_options
@click.option("--port", type=int, default=8080, show_default=True, help="Port on 127.0.0.1.")
@handle_errors
def dashboard(study, storage, port) -> None:
    """Browse a study in optuna-dashboard on 127.0.0.1 (until Ctrl-C)."""
    from autotune.report import dashboard_url, require_dashboard, serve_dashboard
    from autotune.search import load_study

    require_dashboard()  # before anything is opened
    loaded = load_study(study, storage)
    click.echo(f"optuna-dashboard for study {loaded.study_name}: {dashboard_url(loaded, port)}  (Ctrl-C to stop)", err=True)
    serve_dashboard(loaded, port)
