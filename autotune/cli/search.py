"""`autotune search`: run or resume a study, with progress, and write the best recipe."""

from __future__ import annotations

import sys

import click

from autotune.cli._options import (
    CONTEXT_SETTINGS,
    DURATION,
    FRACTION,
    emit_json,
    global_batch_option,
    json_option,
    memory_limit_option,
    run_options,
)


@click.command(context_settings=CONTEXT_SETTINGS)
@run_options
@click.option("--study", default=None, help="Study name (default: <model>-<device slug>, e.g. gpt2-nvidia-h200).")
@click.option(
    "--storage",
    default=None,
    envvar="AUTOTUNE_STORAGE",
    show_envvar=True,
    help="Optuna storage URL (default: sqlite:///studies/<study>.db); journal:PATH for one host, many workers; "
    "postgresql://... for many hosts (the environment variable keeps a password off the command line).",
)
@click.option(
    "--space", default=None, help="Search space YAML (default: search_spaces/gpt2.yaml on CUDA, cpu.yaml on CPU)."
)
@memory_limit_option
@global_batch_option
@click.option(
    "--memory-fraction",
    type=float,
    default=None,
    help="Limit as a fraction of the device's total memory (default 0.9).",
)
@click.option(
    "--memory-headroom",
    type=FRACTION,
    default=None,
    help="Feasible only if a configuration's worst-case peak is at most the limit less this share of it; "
    "5% or 0.05 (default 5%: fragmentation over hours of training and the evaluation, checkpoint and "
    "communication buffers a tuning run never makes add a few percent). A resumed study keeps its own.",
)
@click.option(
    "--n-trials",
    type=int,
    default=None,
    help="Trials to run in this invocation, reference trials included (default 20; with --until-converged, "
    "no cap unless given).",
)
@click.option("--timeout", type=DURATION, default=None, help="Stop starting new trials after this long, e.g. 10m.")
@click.option(
    "--trial-timeout",
    type=DURATION,
    default=None,
    help="Kill a trial after this long (default 300s on CPU, 600s on CUDA).",
)
@click.option(
    "--recipe", "recipe_path", default=None, help="Where to write the best recipe (default: recipes/<study>.json)."
)
@click.option(
    "--warm-start-from",
    default=None,
    help="Start a new study with another study's best configurations (REF: .db path or URL#study).",
)
@click.option(
    "--devices",
    default=None,
    metavar="0,1,...",
    help="One worker per GPU of this host (indices as nvidia-smi lists them, or UUIDs), all on one study; "
    "--n-trials is then the total. Use journal:PATH or PostgreSQL storage.",
)
@click.option(
    "--new-study",
    is_flag=True,
    help="Start a new study even when one of this name exists (it is named NAME-2, NAME-3, ...). A resumed "
    "study keeps its memory limit, --global-batch-tokens, --steps and --min-time; to change them, start a new one.",
)
@click.option(
    "--objective",
    type=click.Choice(["tokens_per_sec", "tokens_per_joule"]),
    default=None,
    help="What to maximize under the memory limit: effective tokens/s (default), or tokens per joule "
    "(needs an energy counter: NVML on a whole GPU, RAPL on a CPU). A resumed study keeps its own.",
)
@click.option(
    "--until-converged",
    is_flag=True,
    help="Stop once no trial in the last K improved the best feasible tokens/s by more than the measurement "
    "noise (K = max(10, 2 x the space's knobs); the noise from the trials' own spread).",
)
@click.option(
    "--no-memory-model",
    "memory_model",
    flag_value=False,
    default=True,
    help="Run every configuration, even one the study's trials predict over the memory limit.",
)
@click.option(
    "--no-expert-start",
    "expert_start",
    flag_value=False,
    default=True,
    help="Do not start a new study with the configuration experts run on this device class.",
)
@click.option(
    "--no-references",
    "references",
    flag_value=False,
    default=True,
    help="Do not open a new study with the baseline and checklist trials (the checklist compiles: tens of "
    "seconds on a CPU). The summary and the recipe then report no speedup over them.",
)
@click.option(
    "--no-confirm",
    "confirm",
    flag_value=False,
    default=True,
    help="Do not re-measure the leaders at the end (up to 3 more trials): the recipe is then the best single "
    "run, which noise may have favoured. For quick looks.",
)
@click.option("--worker", is_flag=True, hidden=True)  # a child of --devices: the parent prints the summary
@json_option
def search(
    model,
    device,
    data,
    seq_len,
    warmup,
    steps,
    min_time,
    seed,
    study,
    storage,
    space,
    memory_limit,
    global_batch_tokens,
    memory_fraction,
    memory_headroom,
    n_trials,
    timeout,
    trial_timeout,
    recipe_path,
    warm_start_from,
    devices,
    new_study,
    objective,
    until_converged,
    memory_model,
    expert_start,
    references,
    confirm,
    worker,
    as_json,
) -> None:
    """Run (or resume) an Optuna study over the search space and write the best recipe.

    Each trial runs in a fresh process and is measured in effective tokens/s; a trial
    whose peak memory breaks the limit is infeasible and can never be the best. Running
    the same command again adds trials to the same study. Ctrl-C, SIGTERM or SIGHUP stop it:
    the running trial is recorded, the best so far written; exit 130, 143 or 129.
    """
    from autotune.present.progress import TerminalProgress
    from autotune.present.summaries import search_summary, summary_json
    from autotune.search.run import SearchInterrupted, SearchSettings, run_search

    if n_trials is not None and n_trials < 1:
        raise click.BadParameter("must be at least 1", param_hint="--n-trials")
    if n_trials is None and not until_converged:
        n_trials = 20
    settings = SearchSettings(
        model=model,
        device=device,
        data=data,
        seq_len=seq_len,
        study=study,
        storage=storage,
        space=space,
        memory_limit_bytes=memory_limit,
        memory_fraction=memory_fraction,
        memory_headroom=memory_headroom,
        n_trials=n_trials,
        timeout_s=timeout,
        trial_timeout_s=trial_timeout,
        warmup=warmup,
        steps=steps,
        min_time_s=min_time,
        seed=seed,
        recipe=recipe_path,
        warm_start_from=warm_start_from,
        new_study=new_study,
        global_batch_tokens=global_batch_tokens,
        objective=objective,
        until_converged=until_converged,
        memory_model=memory_model,
        expert_start=expert_start,
        references=references,
        confirm=confirm,
        worker=worker,
    )
    reporter = TerminalProgress(
        n_trials, quiet=as_json or bool(devices), timeout_s=timeout, what=f"{model} on {device}"
    )
    try:
        if devices:
            from autotune.search.fleet import run_workers

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
