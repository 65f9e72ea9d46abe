"""What the integrations share: the batch size a token budget becomes, installed versions,
quiet construction of a library's objects (they log at length when built), and the quoting of
every value an export writes into a program (`comment`, `python_literal`, `python_name`,
`shell_word`)."""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import math
import shlex
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

from autotune import registry
from autotune.errors import AutotuneError, UsageError, printable
from autotune.recipe.recipe import Recipe

# --- values in generated programs -----------------------------------------------------------
# A recipe is shared, and its text fields (model, hardware and study names, ...) are whatever its
# author wrote: in an export that is a program, a newline in one would end a comment and the next
# line would run (issue D, X01/X02). So every value an export writes into a program goes through
# exactly one of these, chosen by where it lands: a comment, a Python expression or name, a shell word.


def comment(text: object) -> str:
    """`# text` as one line of a Python or shell comment: every control, format or line-separator
    character (newline, CR, the other C0/C1 controls, U+0085, U+2028, U+2029, ...) is written as
    its escape (`errors.printable`), so nothing in `text` can end the comment."""
    return "# " + printable(text)


_PLAIN = (str, int, float, bool, type(None))


def python_literal(value: Any) -> str:
    """A Python expression that evaluates to `value`: its repr, for plain data only (text,
    numbers, booleans, None, and lists, tuples and dicts of them). Another object's repr is
    whatever its class says, possibly code, and inf/nan repr as names: refused (a bug here)."""
    _check_plain(value)
    return repr(value)


def _check_plain(value: Any) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise AutotuneError(f"export: {value!r} has no Python literal")
    if isinstance(value, (list, tuple)):
        for item in value:
            _check_plain(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_plain(key)
            _check_plain(item)
    elif not isinstance(value, _PLAIN):
        raise AutotuneError(f"export: a {type(value).__name__} is not plain data to write as Python")


def python_name(name: str) -> str:
    """`name` (a keyword argument, a torch dtype, a module path `a.b.c`) where a program names
    something: dotted identifiers only, or refused (a bug here: names come from our tables)."""
    if not isinstance(name, str) or not all(part.isidentifier() for part in name.split(".")):
        raise AutotuneError(f"export: {name!r} is not a Python name")
    return name


def shell_word(value: object) -> str:
    """`value` as one shell word, taken literally (no expansion, no command substitution)."""
    return shlex.quote(str(value))


def recipe_seq_len(recipe: Recipe, seq_len: int | None = None) -> int | None:
    """`seq_len`, else the sequence length the recipe was measured at (None if it records none)."""
    if seq_len is not None:
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
            raise UsageError(f"seq_len must be a positive integer, got {seq_len!r}")
        return seq_len
    value = recipe.model.get("seq_len")
    return int(value) if isinstance(value, int) and value > 0 else None


def sequences_per_step(recipe: Recipe, seq_len: int | None = None) -> int:
    """A fixed batch size for libraries that have no token budget: token_budget // seq_len
    (at least 1), seq_len being yours or else the recipe's."""
    length = recipe_seq_len(recipe, seq_len)
    return max(1, recipe.config.token_budget // length) if length else 1


def checkpointed_blocks(recipe: Recipe) -> str:
    """The blocks the recipe checkpoints, as `blocks [0, 1, 5] of 12` (of N when the recipe
    records n_layer); "" when it checkpoints none."""
    layers = list(recipe.config.checkpoint_layers)
    if not layers:
        return ""
    n_layer = recipe.model.get("n_layer")
    return f"blocks {layers}" + (f" of {n_layer}" if n_layer else "")


def compiled_scope(recipe: Recipe) -> str:
    """What the recipe compiles at its compile_scope, with the call that does it by hand
    (after checkpointing); "" when it compiles nothing. What `apply_to_model` does."""
    cfg = recipe.config
    if cfg.compile_mode == "none":
        return ""
    mode = f'mode="{cfg.compile_mode}"'
    if cfg.compile_scope == "model":
        return f"the whole model (model.compile({mode}))"
    blocks = f"each block (block.compile({mode}))"
    if cfg.compile_scope == "blocks+head":
        return f"{blocks} and the head (torch.compile(model.head_loss, {mode}))"
    return blocks


def installed_version(*distributions: str) -> str | None:
    """The version of the first of `distributions` that is installed, else None."""
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def major_minor(version: str) -> tuple[int, int]:
    parts = [int("".join(c for c in p if c.isdigit()) or 0) for p in version.split(".")[:2]]
    return (parts + [0, 0])[0], (parts + [0, 0])[1]


@contextlib.contextmanager
def quietly(*loggers: str) -> Iterator[None]:
    """Construct a library's object for checking without its log lines and warnings."""
    saved = [(logging.getLogger(name), logging.getLogger(name).level) for name in loggers]
    for logger, _ in saved:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in saved:
            logger.setLevel(level)


@dataclass(frozen=True)
class View:
    """What a knob's export mapping reads besides its value (`registry.Knob.hf`, `.lightning`,
    `.loader`): the recipe and its configuration, the installed library's field names, whether
    the user applies the recipe to the model (then Trainer must not checkpoint or compile it
    again), and the batch size its token budget becomes."""

    recipe: Recipe
    names: Any = None  # integrations.hf.Names: the installed transformers' field names
    model_applied: bool = False
    sequences_per_step: int = 1
    major_version: int = 2  # of the library (Lightning 1.x names precisions otherwise)

    @property
    def cfg(self) -> Any:
        return self.recipe.config


def knob_fields(hook: str, view: View) -> dict[str, Any]:
    """Every knob's fields for one library (`hook`: "hf", "lightning" or "loader"), in the
    registry's order. A field several knobs fill (a mapping: TrainingArguments' fsdp_config,
    Lightning's strategy and its init_args) is merged, each knob giving its own keys."""
    out: dict[str, Any] = {}
    for knob in registry.knobs_of(registry.TRAIN):
        mapping = getattr(knob, hook)
        if mapping is not None:
            merge_fields(out, mapping(getattr(view.cfg, knob.name), view))
    return out


def merge_fields(into: dict[str, Any], fields: Mapping[str, Any]) -> None:
    """`into.update(fields)`, but mappings on both sides are merged key by key (recursively)."""
    for key, value in fields.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            merge_fields(into[key], value)
        else:
            into[key] = dict(value) if isinstance(value, Mapping) else value


def knob_notes(hook: str, library: str, view: View) -> list[str]:
    """What the library cannot express, knob by knob (`hook`: "hf_note" or "lightning_note").
    A knob with no mapping and no note for this library, set to other than its default, gets a
    plain one: the library has no argument for it, `recipe.apply_to_model` applies it."""
    lines = []
    for knob in registry.knobs_of(registry.TRAIN):
        value = getattr(view.cfg, knob.name)
        note = getattr(knob, hook)
        if note is not None:
            said = note(value, view)
            if said:
                lines.append(said)
        elif getattr(knob, hook.removesuffix("_note")) is None and knob.loader is None and value != knob.default:
            lines.append(
                f"The recipe sets {knob.name}={registry.value_text(value)} ({knob.about}), which {library} has no "
                "argument for: recipe.apply_to_model(model) applies it."
            )
    return lines


METER_FILE = "autotune_meter.json"  # a callback's report, written beside the run's output


def finish_meter(meter: Any, directory: str | None, log: logging.Logger) -> Path | None:
    """At a run's end: its verdict logged in one line (a warning unless the run matches its
    recipe), the report written to `directory`/METER_FILE (None: not written), the meter closed."""
    try:
        verdict = meter.judged()
        (log.info if verdict.status == "matches" else log.warning)("autotune: %s", verdict.line)
        return meter.save(Path(directory) / METER_FILE) if directory is not None else None
    finally:
        meter.close()
