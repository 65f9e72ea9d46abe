"""A bad knob assignment (`bench --set`, `search --fix`) is refused before anything imports
torch (issue D, #6: `autotune bench --set nonsense=1` took 25-30 s to say one line, the time to
import torch, where any other bad option took 2 s)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import invoke, repo_env

# The command in a fresh interpreter, as `autotune ARGS` runs it; then whether torch was imported.
PROBE = """
import sys
from autotune.cli import main
try:
    main.main(sys.argv[1:], prog_name="autotune")
except SystemExit as exc:
    code = exc.code
print(code, "torch" in sys.modules)
"""


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["bench", "--set", "nonsense=1"], "unknown knob 'nonsense'"),
        (["bench", "--set", "amp_dtype=float17"], "'float17' for amp_dtype"),
        (["bench", "--task", "generate", "--set", "dtype=float17"], "'float17' for dtype"),
        (["search", "--task", "generate", "--fix", "nonsense=1"], "unknown knob 'nonsense'"),
        (["search", "--task", "generate", "--fix", "dtype=float17"], "'float17' for dtype"),
    ],
    ids=["bench-unknown", "bench-value", "bench-generate", "search-fix-unknown", "search-fix-value"],
)
@pytest.mark.slow
def test_a_bad_knob_assignment_is_refused_in_one_line_before_torch_is_imported(tmp_path, args, named):
    args = [*args, "--model", "gpt2-tiny", "--device", "cpu"]
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args], cwd=tmp_path, env=repo_env(), capture_output=True, text=True, timeout=120
    )
    assert done.stdout.split() == ["2", "False"], (done.stdout, done.stderr)  # exit 2, torch not imported
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and named in lines[0], lines
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_a_generation_search_reads_its_fix_before_it_looks_at_the_model_or_device(tmp_path, monkeypatch):
    """A user's model is probed in a child process (torch, the model built: tens of seconds);
    a bad --fix is refused before that, as before the device is looked at."""
    import autotune.search.generate
    import autotune.search.preflight

    def too_late(*args, **kwargs):
        raise AssertionError("--fix is read first")

    monkeypatch.setattr(autotune.search.generate, "resolve_workload", too_late)
    monkeypatch.setattr(autotune.search.preflight, "resolve_device", too_late)
    monkeypatch.chdir(tmp_path)
    model = ["--model", "tests.fixture_models:make_llama", "--device", "cpu"]
    result = invoke("search", "--task", "generate", "--fix", "nonsense=1", *model)
    assert result.exit_code == 2, result.output
    assert "unknown knob 'nonsense' in --fix" in result.output and len(result.output.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []
