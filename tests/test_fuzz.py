"""Property-based attacks on every parser of user input (issue 14, "fuzz the parsers"): recipes,
search spaces, storage URLs, memory sizes and durations; and (issue E) every numeric option of
the command line and every AUTOTUNE_* variable, through the CLI itself (each command's work
replaced: no measurement ever runs here). Whatever the input, the answer is a value or one
UsageError line: never another exception (a traceback), never a file written, and never a
password in what is shown. A space that loads samples without error.

Each test is bounded to a few seconds (max_examples, no example database written)."""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import string
import tempfile
import warnings
from pathlib import Path
from urllib.parse import quote

import optuna
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from autotune.config import TrainConfig
from autotune.errors import UsageError
from autotune.recipe.recipe import Recipe
from autotune.space.file import load_space, parse_space
from autotune.space.sampling import suggest
from autotune.study.urls import redact
from autotune.units import parse_duration, parse_memory_size

optuna.logging.set_verbosity(optuna.logging.ERROR)
# 30 examples each under the "ci" profile (derandomized: the same every run, see tests/conftest.py),
# with the bugs once found pinned as explicit examples; the "explore" profile draws 500, new each
# run (HYPOTHESIS_PROFILE=explore: what to run after changing a loader). 100 each cost the fast
# tier ~7 s of its ~60 for nothing the pinned examples and the explore runs do not find.
FUZZ = settings(
    max_examples=settings.default.max_examples,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@contextlib.contextmanager
def nothing_written():
    """Run in an empty folder that must still be empty afterwards."""
    here = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        try:
            yield Path(tmp)
            assert os.listdir(tmp) == [], f"an input wrote {os.listdir(tmp)}"
        finally:
            os.chdir(here)


def one_line(exc: UsageError) -> str:
    text = str(exc)
    assert text and "\n" not in text and "Traceback" not in text, text
    return text


# --- values of every JSON/YAML type, for mutating files ---------------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["n_layer", "float32", "padded", "spread", "none", "true", "0", "1e400", "-1", ""]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)),
    max_leaves=12,
)


def mutate(data, path: list, value):
    """`data` with the value at `path` (keys/indices, followed as far as they go) replaced."""
    data = copy.deepcopy(data)
    node = data
    for step in path[:-1]:
        if isinstance(node, dict) and node:
            node = node[sorted(node, key=str)[step % len(node)]]
        elif isinstance(node, list) and node:
            node = node[step % len(node)]
    if isinstance(node, dict):
        keys = sorted(node, key=str)
        key = keys[path[-1] % len(keys)] if keys and path[-1] >= 0 else f"k{path[-1]}"
        node[key] = value
    elif isinstance(node, list) and node:
        node[path[-1] % len(node)] = value
    return data


paths = st.lists(st.integers(min_value=-1, max_value=20), min_size=1, max_size=4)


# --- recipes ------------------------------------------------------------------------------------------

RECIPE = Recipe(
    config=TrainConfig(num_workers=2, prefetch_factor=2, checkpoint_layers=(0,)),
    model={"name": "gpt2-tiny", "seq_len": 128, "n_layer": 2, "vocab_size": 320},
    measured={"tokens_per_sec": 1000.0, "peak_memory_bytes": 300 << 20, "memory_limit_bytes": 1 << 30},
    reference_speedups={"baseline": 2.0, "checklist": 1.1},
    study={"name": "s", "storage": "sqlite:///x.db", "trial": 3},
    created="2026-11-29T00:00:00+00:00",
).to_dict()


# Found by an outside, non-derandomized run (issue B): a recipe key holding a newline came back in
# a two-line error. Pinned, so the derandomized profile cannot hide it again.
SPEEDUPS_AT = sorted(RECIPE, key=str).index("reference_speedups")


@FUZZ
@given(path=paths, value=values)
@example(path=[SPEEDUPS_AT], value={"k\ney": "x"})
@example(path=[SPEEDUPS_AT], value={"k\x1b[2Jey": None, "fine": "x"})
def test_a_mutated_recipe_is_a_recipe_or_one_line(path, value):
    raw = mutate(RECIPE, path, value)
    with nothing_written():
        try:
            recipe = Recipe.from_dict(raw, where="recipe r.json")
        except UsageError as exc:
            one_line(exc)
            return
        from autotune.config import check_runnable_here

        for action in (recipe.model_to_run, lambda: check_runnable_here(recipe.config)):
            try:
                action()
            except UsageError as exc:
                one_line(exc)
        # Written, it reads back the same (compared as written: a NaN in a free-form section
        # such as `hardware` is never equal to itself).
        again = Recipe.from_dict(json.loads(json.dumps(recipe.to_dict())))
        assert json.dumps(again.to_dict(), sort_keys=True) == json.dumps(recipe.to_dict(), sort_keys=True)


recipe_files = st.one_of(
    st.binary(max_size=300),
    st.text(max_size=300).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.tuples(paths, values).map(lambda pv: json.dumps(mutate(RECIPE, *pv)).encode()),
)


@FUZZ
@given(data=recipe_files)
def test_any_recipe_file_is_read_or_refused_in_one_line(data):
    with nothing_written() as tmp:
        path = tmp / "r.yaml"
        path.write_bytes(data)
        try:
            Recipe.load(path, check_environment=False)
        except UsageError as exc:
            one_line(exc)
        path.unlink()


# --- search spaces --------------------------------------------------------------------------------------

SPACE = {
    "version": 1,
    "fixed": {"batching": "padded"},
    "dimensions": {
        "num_workers": {"choices": [0, 2]},
        "prefetch_factor": {"low": 1, "high": 4, "when": {"num_workers": {"gt": 0}}},
        "token_budget": {"low": 1024, "high": 4096, "step": 1024},
        "amp_dtype": {"choices": ["float32", "bfloat16"]},
        "checkpoint": {"count": {"low": 0, "high": "n_layer"}, "placement": {"choices": ["first", "spread"]}},
    },
    "rules": [{"when": {"num_workers": {"ge": 2}}, "require": {"token_budget": {"ge": 2048}}, "reason": "r"}],
}


@FUZZ
@given(path=paths, value=values, seed=st.integers(min_value=0, max_value=2**16))
@example(path=[0], value={"\n": None}, seed=0)  # a knob named "\n" once made a two-line error
def test_a_mutated_space_loads_and_samples_or_is_one_line(path, value, seed):
    raw = mutate(SPACE, path, value)
    with nothing_written():
        try:
            space = parse_space(raw, source="s.yaml", n_layer=2, seq_len=128)
        except UsageError as exc:
            one_line(exc)
            return
        # What loads never fails mid-study: every sample is a valid configuration.
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for _ in range(4):
                trial = study.ask()
                cfg = suggest(space, trial)
                space.violation(cfg)
                study.tell(trial, 1.0)
        assert len(space.hash) == 16


@FUZZ
@given(
    data=st.one_of(
        st.binary(max_size=300),
        st.text(max_size=400).map(lambda t: t.encode("utf-8", "surrogatepass")),
        st.tuples(paths, values).map(lambda pv: json.dumps(mutate(SPACE, *pv)).encode()),
    )
)
def test_any_space_file_is_read_or_refused_in_one_line(data):
    with nothing_written() as tmp:
        path = tmp / "s.yaml"
        path.write_bytes(data)
        try:
            load_space(path, n_layer=2, seq_len=128)
        except UsageError as exc:
            one_line(exc)
        path.unlink()


# --- storage URLs ------------------------------------------------------------------------------------------

plain = st.text(alphabet=string.ascii_lowercase + string.digits, min_size=1, max_size=8)
# A password: any characters, between markers no other part of a URL can hold (the other parts
# are lower case), so any piece of it that leaks shows as PW... or ...QX.
secrets = st.text(alphabet=string.ascii_letters + string.digits + "@:/?#&=%+ !*'()[];$,~._-", max_size=12).map(
    lambda s: f"PW{s}QX"
)


@st.composite
def urls_with_a_password(draw):
    password = draw(secrets)
    spelled = draw(st.sampled_from([password, quote(password, safe=""), quote(password, safe="@:/")]))
    user, host, db = draw(plain), draw(plain), draw(plain)
    scheme = draw(st.sampled_from(["postgresql", "postgresql+psycopg2", "postgres", "mysql", "mysql+pymysql"]))
    port = draw(st.sampled_from(["", ":5432", ":1"]))
    shape = draw(st.integers(min_value=0, max_value=5))
    url = [
        f"{scheme}://{user}:{spelled}@{host}{port}/{db}",
        f"{scheme}:/{user}:{spelled}@{host}/{db}",  # one slash missing
        f"{scheme}:{user}:{spelled}@{host}/{db}",
        f"{scheme}://{user}@{host}/{db}?sslmode=require&password={spelled}",
        f"{scheme}:///{user}:{spelled}@{host}/{db}",  # one slash too many
        f"{scheme}://{user}:{spelled}@{host}/{db}.db",
    ][shape]
    return url, password


@FUZZ
@given(case=urls_with_a_password())
def test_a_password_never_shows_whatever_the_url(case):
    from autotune.study.urls import parse_storage_url

    url, password = case
    with nothing_written():
        try:
            parse_storage_url(url)
            shown = [redact(url), redact(url + "#study")]
        except UsageError as exc:
            shown = [one_line(exc), redact(url)]
    for text in shown:
        # Any two characters of the password would be a leak; its markers are the test.
        assert "PW" not in text and "QX" not in text, (url, text)


@FUZZ
@given(text=st.text(max_size=120))
def test_any_storage_text_is_a_storage_or_one_line(text):
    from autotune.study.urls import parse_storage_url

    with nothing_written():
        try:
            parsed = parse_storage_url(text)
            assert parsed.kind in ("sqlite", "journal", "rdb")
        except UsageError as exc:
            one_line(exc)
        redact(text)


# --- sizes and durations -------------------------------------------------------------------------------------

numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.sampled_from(["0.5", "1e400", "1e-12", "nan", "inf", "-0", "1_000", ".5", "5.", "1e3", "٣"]),
)
units = st.sampled_from(["", "b", "KiB", "MiB", "GiB", "TiB", "gb", "s", "m", "h", "x", " GiB", "GiBs"])


@FUZZ
@given(text=st.one_of(st.tuples(numbers, units).map("".join), st.text(max_size=30)))
def test_a_memory_size_is_a_sane_number_of_bytes_or_one_line(text):
    try:
        value = parse_memory_size(text)
    except UsageError as exc:
        one_line(exc)
        return
    assert isinstance(value, int) and (1 << 20) <= value <= (1 << 60)


@FUZZ
@given(text=st.one_of(st.tuples(numbers, units).map("".join), st.text(max_size=30)))
def test_a_duration_is_a_sane_number_of_seconds_or_one_line(text):
    try:
        value = parse_duration(text, option="--timeout")
    except UsageError as exc:
        one_line(exc)
        return
    assert isinstance(value, float) and math.isfinite(value) and 0 < value <= 366 * 24 * 3600


# --- the command line's numeric options and the AUTOTUNE_* variables (issue E) ------------------------

option_values = st.one_of(
    numbers,
    st.text(max_size=20),
    st.integers(min_value=-(2**40), max_value=2**40).map(str),
    st.sampled_from(["9" * 5000, "-" + "9" * 5000, "0x10", "+3", " 7 ", "2" * 20, "1e9", "-0.0", "\u0663"]),
)
# A cheap command per numeric option; every one stops before any work (see `no_work`).
NUMERIC_OPTIONS = [
    ("show", "--study", "x", "--limit"),
    ("verify", "R", "--steps"),
    ("verify", "R", "--soak", "--steps"),
    ("verify", "R", "--warmup"),
    ("verify", "R", "--min-time"),
    ("verify", "R", "--tolerance"),
    ("verify", "R", "--timeout"),
    ("profile", "R", "--steps"),
    ("profile", "R", "--warmup"),
    ("bench", "--device", "cpu", "--seq-len"),
    ("bench", "--device", "cpu", "--seed"),
    ("bench", "--device", "cpu", "--steps"),
    ("bench", "--device", "cpu", "--global-batch-tokens"),
    ("bench", "--device", "cpu", "--memory-limit"),
    ("search", "--seed"),
    ("search", "--steps"),
    ("search", "--n-trials"),
    ("search", "--memory-fraction"),
    ("search", "--memory-headroom"),
    ("search", "--trial-timeout"),
    ("dashboard", "--study", "x", "--port"),
]


class NoWork(UsageError):
    """Raised where a command would start its work: a fuzz test never measures anything."""


def no_work(*args, **kwargs):
    raise NoWork("stopped before any work (fuzz test)")


@contextlib.contextmanager
def commands_that_do_no_work():
    """Every command's work replaced by NoWork (one line, exit 2), in an empty folder holding a
    recipe R that must hold nothing else afterwards."""
    import pytest

    from tests.helpers import cpu_recipe, save_recipe

    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as patch:
        here = os.getcwd()
        os.chdir(tmp)
        recipe = save_recipe(cpu_recipe(), Path(tmp) / "r.json")
        for target in (
            "autotune.measure.loop.measure",
            "autotune.recipe.verify.verify_recipe",
            "autotune.recipe.soak_check.soak_recipe",
            "autotune.recipe.profile.profile_recipe",
            "autotune.search.run.run_search",
            "autotune.study.storage.load_study",
            "autotune.cli.studies.require_dashboard",
        ):
            patch.setattr(target, no_work)
        try:
            yield str(recipe)
            assert os.listdir(tmp) == ["r.json"], f"an input wrote {os.listdir(tmp)}"
        finally:
            os.chdir(here)


def assert_one_line_or_success(result) -> None:
    """Exit 0, or a non-zero exit with one `Error:` line on stderr; never a traceback."""
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    if result.exit_code != 0:
        assert result.stderr.startswith("Error: ") and result.stderr.count("\n") == 1, repr(result.stderr)
        assert "Traceback" not in result.output


@FUZZ
@given(option=st.sampled_from(NUMERIC_OPTIONS), value=option_values)
@example(option=("verify", "R", "--soak", "--steps"), value="-3")
@example(option=("search", "--seed"), value="4294967296")
def test_a_numeric_option_is_taken_or_refused_in_one_line(option, value):
    from click.testing import CliRunner

    from autotune.cli import main

    with commands_that_do_no_work() as recipe:
        args = [recipe if a == "R" else a for a in option]
        result = CliRunner().invoke(main, [*args, value])
        assert_one_line_or_success(result)
        if result.exit_code == 2 and "stopped before any work" not in result.stderr:
            assert option[-1] in result.stderr, result.stderr  # the refusal names the option


env_values = st.one_of(
    st.text(max_size=30).filter(lambda t: "\x00" not in t),
    st.integers(min_value=-(10**40), max_value=10**40).map(str),
    st.sampled_from(["9" * 5000, "fork", "exec", "30", "0", "86401", "1024", "1025", " 5 ", "", "\x1b[2J"]),
)


@FUZZ
@given(name=st.sampled_from(sorted(__import__("autotune.environment").environment.VARIABLES)), raw=env_values)
@example(name="AUTOTUNE_HEARTBEAT_S", raw="1" + "0" * 30)
def test_an_autotune_variable_is_valid_or_refused_in_one_line(name, raw):
    from click.testing import CliRunner

    from autotune import environment
    from autotune.cli import main

    try:
        value = environment.value(name, {name: raw})
    except UsageError as exc:
        assert one_line(exc).startswith(f"{name}: expected ")
        refused = True
    else:
        refused = False
        if name == environment.HEARTBEAT_S:
            assert isinstance(value, int) and 1 <= value <= environment.MAX_HEARTBEAT_S
        elif name == environment.MAX_NUM_WORKERS:
            assert value is None or 0 <= value <= 1024
        elif name == environment.TRIAL_START:
            assert value in ("fork", "exec")
    with commands_that_do_no_work():
        result = CliRunner().invoke(main, ["show", "--study", "x"], env={name: raw})
        assert_one_line_or_success(result)
        assert (f"Error: {name}: expected " in result.stderr) == refused, result.stderr
