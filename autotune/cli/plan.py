"""`autotune plan`: will a model train on a card, and what would the search try first there."""

from __future__ import annotations

import click
from click.core import ParameterSource

from autotune.cli._options import CONTEXT_SETTINGS, Number, emit_json, json_option, say, settings_options, study_options
from autotune.device.flops import CARDS
from autotune.search.settings import SearchSettings

OPTIONS = (
    "model",
    "space",
    "seq_len",
    "global_batch_tokens",
    "memory_limit_bytes",
    "memory_fraction",
    "memory_headroom",
)


@click.command(context_settings=CONTEXT_SETTINGS)
@settings_options(SearchSettings, *OPTIONS)
@click.option(
    "--gpu",
    default="current",
    show_default=True,
    metavar="CARD",
    help=f"{', '.join(CARDS)}, or current: this machine's device.",
)
@click.option(
    "--trials",
    type=Number(0, 20),
    default=1,
    show_default=True,
    help="The search's first trials to show (0: none; its planner lists its candidates first, tens of seconds on "
    "two cores).",
)
@study_options
@json_option
def plan(gpu, trials, study, storage, as_json, **values) -> None:
    """Will --model train on --gpu, and with what: the memory of each family of knobs, the largest
    token budget that fits, what would make it fit, the search's first trials there and a tokens/s
    ceiling. A model, not a measurement, with the error it was validated to (docs/plan.md); no GPU
    needed. --study: the model fitted to a study's measured peaks, beside them."""
    from autotune.errors import UsageError
    from autotune.present.plan import plan_text, trials_text
    from autotune.search.plan import first_trials, make_plan, plan_task, study_task

    if study is not None or storage is not None:
        ctx = click.get_current_context()
        given = [
            p.opts[0] for p in ctx.command.params if ctx.get_parameter_source(p.name) is ParameterSource.COMMANDLINE
        ]
        extra = [flag for flag in given if flag not in ("--study", "--storage", "--json", "-v")]
        if extra:
            raise UsageError(
                f"--study plans the study's model on its device, under its limit: give it without {extra[0]}"
            )
        task, records = study_task(study, storage)
        answer, trials = make_plan(task, records=records), 0  # the study's next trials are its search's to choose
    else:
        task = plan_task(SearchSettings.from_options(values), gpu)
        answer = make_plan(task, card=None if gpu == "current" else gpu)
    if as_json:
        emit_json({**answer, "trials": first_trials(task, trials)})
        return
    say(plan_text(answer))  # at once; the first trials once the planner has listed its candidates
    if trials:
        say(trials_text(first_trials(task, trials)))
