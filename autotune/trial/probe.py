"""Learning what the tuner needs of a model (and of a data file) without running the user's
code in the tuner: `probe` builds them in a trial process (`python -m autotune.trial --probe`),
under a timeout, before any study is created.

A factory `package.module:factory` is the user's code: it may raise, call `os._exit`, or hang.
In the tuner, each of these would be a traceback, a silent exit 0 or a tuner hung forever
before any trial timeout applies. Here each is one line (UsageError, exit 2) and nothing was
created. A data file that cannot be read, or whose tokens do not fit the model's vocabulary, is
found here too, before the study is locked to it."""

from __future__ import annotations

from dataclasses import dataclass

from autotune.errors import UsageError
from autotune.trial.runner import run_child


@dataclass(frozen=True)
class ProbedModel:
    """What a study needs of its model."""

    vocab_size: int
    context_length: int
    n_layer: int
    d_model: int | None = None  # heads x head width, where the model says both


def probe(model: str, *, data: str = "synthetic", seq_len: int | None = None, timeout_s: float) -> ProbedModel:
    """Build `model` (and read `data`) in a child process, within `timeout_s`; UsageError (one
    line) when that fails in any way."""
    request = {"model": model, "data": data, "seq_len": seq_len}
    child = run_child(["--probe"], request, timeout_s=timeout_s)
    what = f"model {model!r}" + (f" with data {data}" if data != "synthetic" else "")
    if child.verdict is not None:
        raise UsageError(
            f"{what}: building it took longer than {timeout_s:.0f} s (the trial timeout); it was stopped. "
            "Does the factory wait for something?"
        )
    if child.payload is None:
        last = child.stderr_tail.strip().splitlines()[-1:] if child.stderr_tail.strip() else []
        how = (
            f"exited with status {child.returncode}"
            if child.returncode >= 0
            else f"was killed by signal {-child.returncode}"
        )
        raise UsageError(
            f"{what}: the process building it {how} before the model was built"
            + (f" ({last[0][:200]})" if last else " (does the factory exit the process?)")
        )
    if "error" in child.payload:
        raise UsageError(child.payload["error"])
    shape = child.payload["shape"]
    n_head, head_dim = shape.get("n_head"), shape.get("head_dim")
    d_model = n_head * head_dim if n_head and head_dim else None
    return ProbedModel(shape["vocab_size"], shape["context_length"], shape["n_layer"], d_model)
