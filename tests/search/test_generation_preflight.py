"""Options of a generation search that it took silently (issue D, G08/G09): a knob fixed twice
with two values (the last one won), and several ranks (one process ran, recording no world size).
Each is refused in one line, exit 2, before anything runs or is written."""

from __future__ import annotations

import pytest

from autotune.config import parse_fixed
from autotune.errors import UsageError
from tests.helpers import invoke


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--fix", "decode_compile=none,decode_compile=default"],
            "--fix: decode_compile is given twice, as 'none' and 'default'; give it once",
        ),
        (["--nproc-per-node", "2"], "--nproc-per-node is an option of --task train"),
    ],
)
def test_a_generation_search_refuses_what_it_would_take_silently(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    result = invoke("search", "--task", "generate", "--model", "gpt2-tiny", "--device", "cpu", *args)
    assert result.exit_code == 2, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1, result.output
    assert list(tmp_path.iterdir()) == []  # no studies/, no recipes/


def test_a_knob_fixed_twice_to_one_value_is_that_value():
    assert parse_fixed("dtype=float32, dtype=float32", task="generate") == {"dtype": "float32"}
    with pytest.raises(UsageError, match="--fix: dtype is given twice, as 'float32' and 'bfloat16'"):
        parse_fixed("dtype=float32,batch_size=2,dtype=bfloat16", task="generate")
