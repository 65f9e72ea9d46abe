"""Learning what the tuner needs of a model (and of a data file) without running the user's
code in the tuner: `probe` builds them in a trial process (`python -m autotune.trial --probe`),
under a timeout, before any study is created.

A factory `package.module:factory` is the user's code: it may raise, call `os._exit`, or hang.
In the tuner, each of these would be a traceback, a silent exit 0 or a tuner hung forever
before any trial timeout applies. Here each is one line (UsageError, exit 2) and nothing was
created. A data file that cannot be read, or whose tokens do not fit the model's vocabulary, is
found here too, before the study is locked to it.

The probe is watched as a trial is (`run_child`'s RSS watchdog): a factory that allocates far
more than the run may use (a 20 GiB model under a 1 GiB limit) is stopped at RSS_KILL_FACTOR x
the limit on a CPU, or at HOST_SHARE of the host's memory elsewhere (the model is built on
the host first), before the machine swaps or a cgroup's OOM killer takes the tuner with it."""

from __future__ import annotations

from dataclasses import dataclass

from autotune.device import host_memory_cap
from autotune.errors import UsageError
from autotune.measure.outcomes import OVER_MEMORY_LIMIT, RSS_KILL_FACTOR
from autotune.trial.runner import run_child
from autotune.units import format_bytes

# Without a host limit (a GPU run, or a CPU run without --memory-limit), building the model may
# use at most this share of the host's memory (of its cgroup's, where one limits it).
HOST_SHARE = 0.75


@dataclass(frozen=True)
class ProbedModel:
    """What a study needs of its model."""

    vocab_size: int
    context_length: int
    n_layer: int
    d_model: int | None = None  # heads x head width, where the model says both


def probe(
    model: str,
    *,
    data: str = "synthetic",
    seq_len: int | None = None,
    timeout_s: float,
    host_limit_bytes: int | None = None,
) -> ProbedModel:
    """Build `model` (and read `data`) in a child process, within `timeout_s` and within host
    memory: RSS_KILL_FACTOR x `host_limit_bytes` (a CPU run's memory limit), else HOST_SHARE of
    the host's. UsageError (one line) when that fails in any way."""
    request = {"model": model, "data": data, "seq_len": seq_len}
    rss_limit, of_what = _rss_limit(host_limit_bytes)
    child = run_child(["--probe"], request, timeout_s=timeout_s, rss_limit=rss_limit)
    what = f"model {model!r}" + (f" with data {data}" if data != "synthetic" else "")
    if child.verdict is not None and child.verdict[0] == OVER_MEMORY_LIMIT:
        raise UsageError(
            f"{what}: building it took more than {format_bytes(RSS_KILL_FACTOR * rss_limit)} of memory "
            f"({of_what}); it was stopped. Does the factory build a larger model than this run can hold?"
        )
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


def _rss_limit(host_limit_bytes: int | None) -> tuple[int, str]:
    """The watchdog's limit (it stops the probe past RSS_KILL_FACTOR x it), and what it is."""
    if host_limit_bytes is not None:
        return host_limit_bytes, f"{RSS_KILL_FACTOR}x the memory limit {format_bytes(host_limit_bytes)}"
    cap = host_memory_cap()
    return int(HOST_SHARE * cap / RSS_KILL_FACTOR), f"{HOST_SHARE:.0%} of this host's {format_bytes(cap)}"
