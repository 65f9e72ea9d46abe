"""An option two commands share is one option: `bench`, `verify`, `profile` and `doctor` take
theirs from `search`'s declaration (search.settings, through `cli._options.settings_options`).
An outside review found ten of them declared a second time by hand, `--model` defaulting to
gpt2 in `search` and gpt2-tiny in `bench`. Where a command means something else by a flag, it
says so with a named override in its module; any other difference is a second declaration."""

from __future__ import annotations

import click

from autotune.cli import main

COMMANDS = ("search", "bench", "verify", "profile", "doctor", "plan")  # search's options are the declaration

# The overrides the commands name (cli/recipes.py), and which attributes of the option each changes.
OVERRIDES = {
    ("verify", "--model"): {"default", "help"},  # RECIPES_MODEL: the recipe's model unless given
    ("profile", "--model"): {"default", "help"},
    ("verify", "--data"): {"default", "help"},  # RECIPES_DATA: the recipe's data unless given
    ("profile", "--steps"): {"type", "help"},  # PROFILED_STEPS: from 1, not a timed window's 2
    ("verify", "--timeout"): {"default", "show_default", "help"},  # VERIFY_TIMEOUT: kills the measuring process
    ("plan", "--study"): {"show_default", "help"},  # study_options: a stored study to read, as show's
    ("plan", "--storage"): {"show_default", "help", "envvar"},  # AUTOTUNE_STORAGE reaches --devices workers only
}
ATTRIBUTES = ("default", "help", "show_default", "is_flag", "multiple", "metavar", "envvar", "hidden", "required")


def described(option: click.Option) -> dict:
    """What a user sees of an option and what it takes; its type by class and settings (a Number's
    range), as each command builds a type object of its own."""
    seen = {name: getattr(option, name) for name in ATTRIBUTES}
    return {
        **seen,
        "type": (type(option.type).__name__, vars(option.type)),
        "flags": option.opts + option.secondary_opts,
    }


def by_flag() -> dict[str, dict[str, dict]]:
    """{flag: {command: described option}} over COMMANDS, from click's command objects."""
    flags: dict[str, dict[str, dict]] = {}
    for name in COMMANDS:
        command = main.commands[name]
        for param in command.get_params(click.Context(command)):
            # --help is click's, made per context (its flags cached on the command by whichever context
            # asked first: an earlier test's invocation through the group), declared by no command.
            if isinstance(param, click.Option) and "--help" not in param.opts:
                for flag in param.opts + param.secondary_opts:
                    flags.setdefault(flag, {})[name] = described(param)
    return flags


def test_a_flag_two_commands_share_is_one_option_but_for_the_named_overrides():
    diverged = []
    for flag, options in by_flag().items():
        reference_name = next(iter(options))  # search's where it has the flag
        reference = options[reference_name]
        for name, option in options.items():
            differ = {attribute for attribute in option if option[attribute] != reference[attribute]}
            if differ != OVERRIDES.get((name, flag), set()):
                diverged.append(f"{name} {flag} against {reference_name}: {sorted(differ)}")
    assert diverged == []


def test_every_command_that_runs_the_model_has_the_same_default_model():
    models = {name: options["default"] for name, options in by_flag()["--model"].items()}
    assert models == {"search": "gpt2", "bench": "gpt2", "verify": None, "profile": None, "plan": "gpt2"}
