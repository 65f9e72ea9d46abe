"""The `autotune` command line. Commands are thin: they parse, call the library, print.
Errors from the library (AutotuneError, raised while reading options or running a command)
become one line on stderr and the error's exit code (2: bad input).

Exit codes: 0 done (verify: PASS); 1 a failure (no feasible trial, verify: FAIL, a disk that
filled up mid-study); 2 bad input, nothing run or written; 128 + the signal when stopped:
130 Ctrl-C, 143 SIGTERM, 129 SIGHUP (a search writes its best-so-far recipe first)."""

from __future__ import annotations

import logging
import signal
import sys
from typing import Any, Sequence

import click

from autotune._version import __version__
from autotune.cli._options import CONTEXT_SETTINGS, verbose_option
from autotune.cli.bench import bench
from autotune.cli.doctor import doctor
from autotune.cli.plan import plan
from autotune.cli.recipes import export, profile, verify
from autotune.cli.search import search
from autotune.cli.studies import compare, dashboard, report, show
from autotune.environment import check_environment
from autotune.errors import AutotuneError, printable


class OneLineFormatter(logging.Formatter):
    """Log lines whose message is escaped (`printable`): a path or a name in it cannot start a
    forged line or drive the terminal. A traceback, added after the message, keeps its lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        return printable(super().formatMessage(record))


class AutotuneGroup(click.Group):
    """Turns autotune's exceptions into `Error: <one line>` and their exit code, wherever they
    come from: a command, or an option's type reading its value. SIGTERM and SIGHUP stop a
    command as Ctrl-C does (what `timeout`, systemd, Slurm and Kubernetes send, and a closed
    terminal), and a stop anywhere is one line and 128 + the signal, never click's "Aborted!".
    The first stop signal stops the command in order; the ones after it are absorbed (see
    `stop_signals_raise`), through to the end of the process when the command is its own."""

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        """Every command takes -v after its name as the group does before it."""
        if not any(param.name == "verbose" for param in cmd.params):
            verbose_option(cmd)
        super().add_command(cmd, name)

    def main(self, args: Sequence[str] | None = None, *rest: Any, **kwargs: Any) -> Any:
        from autotune.trial.processes import stop_signals_raise

        # `args` None: the process's own command line, read from sys.argv (a test's CliRunner
        # passes the arguments, and its process goes on after the command).
        with stop_signals_raise(then_ignored=args is None):
            return super().main(args, *rest, **kwargs)

    def invoke(self, ctx: click.Context) -> Any:
        from autotune.trial.processes import exit_code_for, stop_signal_of

        try:
            check_environment()  # every AUTOTUNE_* variable, before anything runs
            return super().invoke(ctx)
        except AutotuneError as exc:
            click.echo(f"Error: {printable(exc)}", err=True)  # one line, whatever the message holds
            sys.exit(exc.exit_code)
        except KeyboardInterrupt as exc:
            sig = stop_signal_of(exc)
            how = "interrupted (Ctrl-C)" if sig == signal.SIGINT else f"stopped by {signal.Signals(sig).name}"
            click.echo(f"Error: {how}", err=True)
            sys.exit(exit_code_for(exc))


@click.group(cls=AutotuneGroup, context_settings=CONTEXT_SETTINGS)
@click.version_option(__version__, "-V", "--version", prog_name="autotune")
@verbose_option
def main() -> None:
    """Find the fastest way to train a GPT-2-class model on this machine, within a memory
    limit, and hand it back as a recipe."""
    handler = logging.StreamHandler()
    handler.setFormatter(OneLineFormatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(handlers=[handler])  # the level is -v's (the root's: WARNING without it)


for _command in (bench, search, plan, show, export, verify, profile, compare, report, dashboard, doctor):
    main.add_command(_command)
