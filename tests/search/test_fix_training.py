"""`search --fix` holds training knobs (issue D, #11: it was generation-only, and holding a
training knob took a YAML file): each held knob leaves the searched dimensions and every trial
runs with it; the space (and so the study) is another one; what cannot be held is one line."""

from __future__ import annotations

import optuna
import pytest

from autotune.errors import UsageError
from autotune.search.preflight import preflight
from autotune.space.sampling import suggest
from tests.helpers import TINY_SPACE, invoke, search_settings

optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_a_held_knob_is_no_longer_searched_and_every_trial_runs_with_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    free = preflight(search_settings(space=str(TINY_SPACE))).task.space
    held = preflight(search_settings(space=str(TINY_SPACE), fix="sdpa_backend=math,pin_memory=true")).task.space
    assert "sdpa_backend" in free.dimensions and "sdpa_backend" not in held.dimensions
    assert held.fixed["sdpa_backend"] == "math" and held.fixed["pin_memory"] is True
    assert held.hash != free.hash  # another space: a study of it is another study
    study = optuna.create_study()
    for _ in range(6):
        cfg = suggest(held, study.ask())
        assert (cfg.sdpa_backend, cfg.pin_memory) == ("math", True)


def test_no_checkpointing_can_be_held_and_a_block_list_cannot(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    held = preflight(search_settings(space=str(TINY_SPACE), fix="checkpoint_layers=none")).task.space
    assert held.checkpoint is None
    with pytest.raises(UsageError, match="--fix checkpoint_layers takes none only"):
        preflight(search_settings(space=str(TINY_SPACE), fix="checkpoint_layers=0,1"))


@pytest.mark.parametrize(
    "fix, message",
    [
        ("nonsense=1", "unknown knob 'nonsense' in --fix"),
        ("dtype=float32", "unknown knob 'dtype' in --fix"),  # a generation knob
        ("amp_dtype=float17", "'float17' for amp_dtype"),
        (
            "token_budget=1024,amp_dtype=float32,compile_mode=none,sdpa_backend=math,num_workers=0,"
            "checkpoint_layers=none",
            "--fix holds every knob",
        ),
    ],
)
def test_what_cannot_be_held_is_one_line_and_nothing_is_written(tmp_path, monkeypatch, fix, message):
    monkeypatch.chdir(tmp_path)
    result = invoke("search", "--model", "gpt2-tiny", "--device", "cpu", "--space", str(TINY_SPACE), "--fix", fix)
    assert result.exit_code == 2, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1, result.output
    assert list(tmp_path.iterdir()) == []
