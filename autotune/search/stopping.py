"""Why a search stopped, for its summary and `--json`: the planner found nothing left worth a
trial (`settled`, with its reason), `--n-trials` or the trial cap was reached, `--timeout`
passed, someone stopped it (Ctrl-C, SIGTERM, SIGHUP), or a disk the trials write to filled up."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SETTLED, N_TRIALS, TIMEOUT, INTERRUPTED = "settled", "n_trials", "timeout", "interrupted"
NO_ROOM = "no_room"


@dataclass(frozen=True)
class SearchStop:
    """Why a search stopped: `reason` one of SETTLED, N_TRIALS, TIMEOUT, INTERRUPTED, NO_ROOM;
    `text` one line for people."""

    reason: str
    text: str

    def to_dict(self) -> dict[str, Any]:
        return {"reason": self.reason, "text": self.text}


def settled_stop(why: str) -> SearchStop:
    return SearchStop(SETTLED, f"settled: {why}")


def budget_stop(
    *, ran: int, n_trials: int | None, timeout_s: float | None, cap: bool = False, doubt: str | None = None
) -> SearchStop:
    """The trial count or the timeout: what ended a search that neither settled nor was stopped;
    `doubt`: the planner's word on why it had not settled (it mispredicted its own trials)."""
    runs = f"{ran} trial{'s' if ran != 1 else ''} run" + (f"; {doubt}" if doubt else "")
    if n_trials is not None and ran >= n_trials:
        what = "the trial cap" if cap else "--n-trials"
        return SearchStop(N_TRIALS, f"{what} reached ({runs})")
    if timeout_s is not None:
        return SearchStop(TIMEOUT, f"--timeout reached ({timeout_s:g} s; {runs})")
    return SearchStop(N_TRIALS, runs)


def interrupted_stop(signal_name: str) -> SearchStop:
    how = "Ctrl-C" if signal_name == "SIGINT" else signal_name
    return SearchStop(INTERRUPTED, f"stopped by {how}")


def no_room_stop(why: str) -> SearchStop:
    return SearchStop(NO_ROOM, why)
