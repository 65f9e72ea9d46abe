"""`autotune search`: run or resume a study, with progress, and write the best recipe."""

from __future__ import annotations

import sys

import click

from autotune.cli._options import CONTEXT_SETTINGS, emit_json, json_option, say, settings_options
from autotune.errors import printable
from autotune.search.settings import SearchSettings


@click.command(context_settings=CONTEXT_SETTINGS)
@settings_options(SearchSettings)
@click.option(
    "--devices",
    default=None,
    metavar="0,1,...",
    help="One worker per GPU of this host (indices as nvidia-smi lists them, or UUIDs), all on one study; "
    "--n-trials is then the total. Use journal:PATH or PostgreSQL storage.",
)
@json_option
def search(devices, as_json, **values) -> None:
    """Run (or resume) an Optuna study over the search space and write the best recipe.

    --task generate tunes text generation instead: output tokens/s of the workload (--prompt-len
    or --prompts, --new-tokens) under the memory limit and any latency bounds.

    Each trial runs in a fresh process and is measured in effective tokens/s; a trial
    whose peak memory breaks the limit is infeasible and can never be the best. Running
    the same command again adds trials to the same study. Ctrl-C, SIGTERM or SIGHUP stop it:
    the running trial is recorded, the best so far written; exit 130, 143 or 129.
    """
    from autotune.present.progress import TerminalProgress
    from autotune.present.summaries import search_summary, summary_json
    from autotune.search.run import SearchStopped, run_search
    from autotune.study.leaders import LEADERS

    settings = SearchSettings.from_options(values)
    if devices and settings.nproc_per_node > 1:
        from autotune.errors import UsageError

        raise UsageError(
            "--devices runs one single-GPU worker per device; --nproc-per-node runs each trial on N GPUs: "
            "use one or the other"
        )
    if devices and settings.task == "generate":
        from autotune.errors import UsageError

        raise UsageError(
            "--devices runs training workers; a generation study runs in one process (leave --devices out)"
        )
    reporter = TerminalProgress(
        settings.trial_cap,
        quiet=as_json or bool(devices),
        timeout_s=settings.timeout_s,
        what=f"{settings.model} on {settings.device}",
        # the leaders' re-measurements after the last trial (search.confirm), in the estimate
        confirm_runs=LEADERS if settings.confirm and settings.task != "generate" else 0,
    )
    try:
        if devices:
            from autotune.search.fleet import run_workers

            result = run_workers(settings, devices, as_json=as_json)
        else:
            result = run_search(settings, reporter)
    except SearchStopped as stop:
        reporter.close()
        if not settings.worker:
            say(search_summary(stop.result), err=True)
        raise
    finally:
        reporter.close()
    if settings.worker:
        return  # the --devices parent prints the summary of the whole study
    for failure in result.worker_failures:
        click.echo(f"Error: {printable(failure)}", err=True)
    if as_json:
        emit_json(summary_json(result))
    else:
        say(search_summary(result))
    if result.summary.best is None:
        click.echo(f"Error: {printable(result.summary.no_best_reason)}; no recipe written", err=True)
        sys.exit(1)
    if result.worker_failures:
        sys.exit(1)
