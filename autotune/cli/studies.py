"""Commands that read stored studies: `show`, `compare`, `report` and `dashboard`. They
import no torch."""

from __future__ import annotations

from pathlib import Path

import click

from autotune.cli._options import CONTEXT_SETTINGS, LIST_LIMIT, PORT, emit_json, json_option, say, study_options
from autotune.errors import printable


@click.command(context_settings=CONTEXT_SETTINGS)
@study_options
@json_option
@click.option("--limit", type=LIST_LIMIT, default=20, show_default=True, help="Trials to list (best first).")
def show(study, storage, as_json, limit) -> None:
    """Show a stored study: its trials (best first), outcome counts and the best. Without
    --study, list the studies in --storage (or under studies/, where search writes them)."""
    from autotune.present.summaries import show_json, show_text, studies_json, studies_text
    from autotune.study.catalog import list_studies
    from autotune.study.storage import load_study, open_storage, study_names
    from autotune.study.summary import summarize

    # One study in a named storage is shown; anything else is listed. Counted, not listed, first:
    # listing reads every trial, and a damaged one would be warned of twice.
    if study is None and (storage is None or len(study_names(open_storage(storage, create=False))) != 1):
        entries = list_studies(storage)
        if as_json:
            emit_json(studies_json(entries))
        else:
            say(studies_text(entries))
        return
    loaded = load_study(study, storage)
    summary = summarize(loaded)
    if as_json:
        emit_json(show_json(loaded, summary))
    else:
        say(show_text(loaded, summary, limit))


@click.command(context_settings=CONTEXT_SETTINGS)
@click.argument("refs", nargs=-1, required=True, metavar="REF...")
@json_option
@click.option("--markdown", "as_markdown", is_flag=True, help="Print a Markdown table.")
def compare(refs, as_json, as_markdown) -> None:
    """Compare studies side by side: the same model tuned on two GPUs, say.

    A REF is a storage (PATH.db, PATH.journal, journal:PATH or an Optuna storage URL),
    with #STUDY when the storage holds more than one study:
    studies/gpt2-nvidia-a100.db  or  postgresql://tuner@db/autotune#gpt2-h200.
    Knobs whose best value differs between the studies are marked with *.
    """
    from autotune.errors import UsageError
    from autotune.present.compare import comparison_markdown, comparison_text, load_comparison

    if as_json and as_markdown:
        raise UsageError("give --json or --markdown, not both")
    comparison = load_comparison(refs)
    if as_json:
        emit_json(comparison.to_dict())
    elif as_markdown:
        say(comparison_markdown(comparison))
    else:
        say(comparison_text(comparison))


@click.command(context_settings=CONTEXT_SETTINGS)
@study_options
@click.option("--out", "out_dir", default=None, help="Folder to write (default: reports/<study>).")
def report(study, storage, out_dir) -> None:
    """Write a study's figures (PNG) and report.md beside them: readable without Python."""

    from autotune.present.report import write_report
    from autotune.study.storage import load_study
    from autotune.study.urls import check_study_name, default_storage_url, redact

    loaded = load_study(study, storage)
    # The name is the database's, whoever wrote it: as a folder name ("../../x", "/etc/x") it would
    # write outside reports/. Refused as export and search refuse it (issue D, R06).
    out = out_dir or Path("reports") / check_study_name(loaded.study_name)
    shown = redact(storage or default_storage_url(loaded.study_name))
    written = write_report(loaded, out, storage=shown)
    for path in [*written.images.values(), written.markdown]:
        click.echo(f"wrote {printable(path)}")
    click.echo(f"open {printable(written.markdown)}")


@click.command(context_settings=CONTEXT_SETTINGS)
@study_options
@click.option("--port", type=PORT, default=8080, show_default=True, help="Port on 127.0.0.1 (1-65535).")
def dashboard(study, storage, port) -> None:
    """Browse a study in optuna-dashboard on 127.0.0.1 (until Ctrl-C)."""
    from autotune.errors import UsageError
    from autotune.study.storage import internals, load_study
    from autotune.trial.processes import stops_not_swallowed

    server = require_dashboard()  # before anything is opened
    check_port_free(port)
    loaded = load_study(study, storage)
    served, study_id = internals(loaded)  # our storage as it is: a journal's recovery, SQLite's waits
    click.echo(
        f"optuna-dashboard for study {printable(loaded.study_name)}: "
        f"http://127.0.0.1:{port}/dashboard/studies/{study_id}  (Ctrl-C stops it: exit 130)",
        err=True,
    )
    try:
        with stops_not_swallowed():  # bottle's server swallows Ctrl-C: exit 130 / 143 all the same
            server.run_server(served, host="127.0.0.1", port=port)  # our attrs are plain JSON: shown as they are
    except OSError as exc:  # taken between the check and the server's own bind
        raise UsageError(f"--port {port}: cannot serve on 127.0.0.1:{port} ({exc.strerror or exc})") from None


def require_dashboard():
    """The optuna_dashboard module, or AutotuneError (exit 1) saying how to install it."""
    from autotune.errors import AutotuneError

    try:
        import optuna_dashboard
    except ImportError:
        raise AutotuneError("the dashboard needs optuna-dashboard: pip install optuna-dashboard") from None
    return optuna_dashboard


def check_port_free(port: int) -> None:
    """Refuse, before anything is opened, a port that another program holds or that this user
    may not bind, in one line that says what to do."""
    import errno
    import socket

    from autotune.errors import UsageError

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise UsageError(
                    f"--port {port}: 127.0.0.1:{port} is in use by another program; choose another port"
                ) from None
            raise UsageError(f"--port {port}: cannot listen on 127.0.0.1:{port} ({exc.strerror or exc})") from None
