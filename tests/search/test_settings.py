"""`autotune search`'s options are declared once, as SearchSettings fields: the click command's
options and a `--devices` worker's argv are made from them, and round-trip."""

from __future__ import annotations

import dataclasses

from autotune.cli.search import search
from autotune.search.fleet import worker_command
from autotune.search.settings import NEVER, PARENT, PASS, SearchSettings, worker_argv

# A value other than the default for every setting a worker is passed as it is.
GIVEN = {
    "model": "gpt2-medium",
    "data": "corpus.bin",
    "seq_len": 512,
    "warmup": 5,
    "steps": 30,
    "min_time_s": 0.5,
    "seed": 7,
    "space": "my_space.yaml",
    "global_batch_tokens": 65536,
    "memory_headroom": 0.00001,  # once written 1e-05, which the fraction parser refused
    "timeout_s": 5400.0,
    "recipe": "recipes/r.json",
    "objective": "tokens_per_joule",
    "memory_model": False,
    "confirm": False,
    "fix": "amp_dtype=bfloat16,compile_mode=none",  # --devices workers hold what the parent was told to
}


def parsed(argv: list[str]) -> SearchSettings:
    """What the `search` command makes of `argv`, as settings (nothing runs)."""
    ctx = search.make_context("search", list(argv))
    values = {k: v for k, v in ctx.params.items() if k not in ("devices", "as_json")}
    return SearchSettings.from_options(values)


def test_every_setting_is_an_option_of_search_and_every_option_a_setting():
    fields = [f.name for f in dataclasses.fields(SearchSettings)]
    params = [p.name for p in search.params]
    # devices and as_json are the command's own; verbose is every command's (cli._options.verbose_option)
    assert sorted(params) == sorted(fields + ["devices", "as_json", "verbose"])
    for name, option, _ in SearchSettings.options():
        assert option.worker in (PASS, PARENT, NEVER), name
        param = next(p for p in search.params if p.name == name)
        assert option.flag in param.opts and param.help == option.help


def test_defaults_on_the_command_line_are_the_settings_defaults():
    assert parsed([]) == SearchSettings()


def test_a_worker_gets_every_setting_it_is_passed_and_parses_it_back():
    assert set(GIVEN) == {name for name, option, _ in SearchSettings.options() if option.worker == PASS}
    given = SearchSettings(**GIVEN)
    back = parsed(worker_argv(given))
    for name in GIVEN:
        assert getattr(back, name) == getattr(given, name), name


def test_the_worker_command_adds_what_the_parent_resolved():
    given = SearchSettings(**GIVEN, storage="postgresql://u:secret@db/x", study="ignored")
    cmd = worker_command(given, study="s", memory_limit_bytes=2**30, trial_timeout_s=90.0, n_trials=3)
    argv = cmd[cmd.index("--worker") + 1 :]
    back = parsed(argv)
    assert (back.study, back.memory_limit_bytes, back.trial_timeout_s, back.n_trials) == ("s", 2**30, 90.0, 3)
    assert back.device == "cuda:0" and back.memory_headroom == GIVEN["memory_headroom"]
    assert "secret" not in " ".join(cmd)  # the storage goes in the worker's environment
