"""A running search as people follow it: trial i of N, the elapsed time, an estimate of what
is left, and the best so far. State and text only (the command line draws it); the clock is
a parameter, so the figures are testable. Torch-free, like all of `present`."""

from __future__ import annotations

import shutil
import sys
import threading
import time
from typing import Any, Callable

from autotune.present.summaries import trial_line
from autotune.present.text import config_summary, flag_unstable, format_rate, printable


def format_duration(seconds: float) -> str:
    """12 s -> 0:12, 125 s -> 2:05, 3725 s -> 1:02:05."""
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class SearchProgress:
    """Where a search stands. `n_trials` is this invocation's (a resumed study's trial
    numbers go on from where it was; None: no cap, --until-converged); `timeout_s` the
    search's --timeout, if any; `confirm_runs` the re-measurements of the leaders that follow the
    last trial (`search.confirm`: up to `study.leaders.LEADERS`; 0 with --no-confirm)."""

    def __init__(
        self,
        n_trials: int | None,
        timeout_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        confirm_runs: int = 0,
    ) -> None:
        self.n_trials = n_trials
        self.timeout_s = timeout_s
        self.confirm_runs = confirm_runs
        self.clock = clock
        self.start = clock()
        self.started = 0  # trials started in this invocation
        self.finished = 0
        self.durations: list[float] = []
        self.running: tuple[int, dict[str, Any], float] | None = None  # number, config, start
        self.best: tuple[int, float, bool] | None = None  # number, tokens/s, unstable
        self.confirmation: tuple[int, int, float] | None = None  # run k of n re-measuring the leaders, its start
        self.phase = "preparing: checking the model, the device and the storage"

    # --- events ---------------------------------------------------------------------------

    def trial_started(self, number: int, config: dict[str, Any]) -> None:
        self.started += 1
        self.running = (number, config, self.clock())
        self.phase = ""

    def trial_finished(self, trial: Any, summary: Any) -> None:
        if self.running is not None:
            self.durations.append(self.clock() - self.running[2])
        self.running = None
        self.finished += 1
        best = getattr(summary, "best", None)
        if best is not None:
            self.best = (best.number, best.figure or 0.0, best.unstable)

    def confirming(self, number: int, index: int = 1, count: int = 1) -> None:
        """Run `index` of `count` re-measuring the leaders (`search.confirm`), after the trials."""
        self.running = None
        self.confirmation = (index, count, self.clock())
        self.phase = f"confirming the leaders ({index} of {count}): re-measuring #{number} in a fresh process"

    # --- figures ----------------------------------------------------------------------------

    def elapsed(self) -> float:
        return self.clock() - self.start

    def remaining(self) -> float | None:
        """Seconds left: the mean trial so far times the trials to go, less what the running
        one has done; never past --timeout; then the confirmation runs, each a mean trial (they
        follow the trials, timeout or not). None until a trial has finished (no basis yet).
        While the leaders are re-measured: those runs still to go."""
        if self.confirmation is not None and self.durations:
            return self._confirmation_left()
        confirming = self.confirm_runs * sum(self.durations) / len(self.durations) if self.durations else 0.0
        if not self.durations or self.n_trials is None:  # no cap: only the timeout bounds it
            return None if self.timeout_s is None else max(0.0, self.timeout_s - self.elapsed()) + confirming
        mean = sum(self.durations) / len(self.durations)
        to_go = max(0, self.n_trials - self.finished)
        left = to_go * mean
        if self.running is not None:
            left -= min(mean, self.clock() - self.running[2])
        left = max(0.0, left)
        if self.timeout_s is not None:
            left = min(left, max(0.0, self.timeout_s - self.elapsed()) + (mean if self.running else 0.0))
        return left + confirming

    def _confirmation_left(self) -> float:
        assert self.confirmation is not None
        index, count, began = self.confirmation
        mean = sum(self.durations) / len(self.durations)
        return max(0.0, (count - index + 1) * mean - min(mean, self.clock() - began))

    # --- text -------------------------------------------------------------------------------

    def counter(self) -> str:
        """ "trial 3/12": the running trial's place in this invocation."""
        return f"trial {self.started}" + (f"/{self.n_trials}" if self.n_trials is not None else "")

    def _times(self) -> str:
        left = self.remaining()
        estimate = f"~{format_duration(left)} left" if left is not None else "~? left"  # known after a trial
        return f"{format_duration(self.elapsed())} elapsed, {estimate}"

    def _best(self) -> str:
        if self.best is None:
            return "no best yet"
        number, rate, unstable = self.best
        return f"best {flag_unstable(format_rate(rate), unstable)} tok/s (#{number})"

    def status_line(self, width: int | None = None) -> str:
        """The live line: the times and the best so far first, then what runs now, its
        configuration last: cut at `width` (the terminal's), the configuration goes first."""
        if self.running is not None:
            number, config, began = self.running
            now = f"{self.counter()} (#{number}, {format_duration(self.clock() - began)}): {config_summary(config)}"
        else:
            now = self.phase or f"{self._done()} trials done"
        line = f"{self._times()} | {self._best()} | {now}"
        return line if width is None else line[:width]

    def finished_line(self, trial: Any) -> str:
        """One line per finished trial (also where there is no terminal: logs, CI)."""
        return f"[{self._done()} {self._times()}; {self._best()}] {trial_line(trial)}"

    def _done(self) -> str:
        return f"{self.finished}/{self.n_trials}" if self.n_trials is not None else str(self.finished)

    def opening_line(self, what: str) -> str:
        if self.n_trials is None:
            return f"search {what}: until converged" + (
                f", at most {format_duration(self.timeout_s)}" if self.timeout_s else ""
            )
        return f"search {what}: {self.n_trials} trial{'s' if self.n_trials != 1 else ''}" + (
            f", at most {format_duration(self.timeout_s)}" if self.timeout_s else ""
        )


class TerminalProgress:
    """What `search` shows while it runs (state and text: `present.progress`). On a terminal,
    a status line redrawn every second from the start (trial i of N, elapsed, estimate, best
    so far) under one line per finished trial; without one (logs, CI), an opening line when the
    first trial starts and one line per finished trial, each with the same figures. Nothing
    when quiet (--json)."""

    TICK_S = 1.0

    def __init__(
        self,
        n_trials: int | None,
        quiet: bool,
        *,
        timeout_s: float | None = None,
        what: str = "",
        confirm_runs: int = 0,
    ) -> None:
        self.quiet = quiet
        self.progress = SearchProgress(n_trials, timeout_s, confirm_runs=confirm_runs)
        self.tty = not quiet and sys.stderr.isatty()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._shown = False
        self._opening: str | None = None
        if quiet:
            return
        self._opening = self.progress.opening_line(what)
        if self.tty:  # drawn now, cleared by close(): a refused search leaves its one error line
            self._draw()
            threading.Thread(target=self._tick, name="autotune-progress", daemon=True).start()

    def trial_started(self, number: int, cfg) -> None:
        if self._opening is not None and not self.tty:
            # In a log the opening line waits for the first trial: everything was validated by
            # then (a refused search prints its one error line and nothing else).
            self._print(self._opening)
        self._opening = None
        with self._lock:
            self.progress.trial_started(number, cfg.to_dict())
        self._draw()

    def confirming(self, number: int, index: int = 1, count: int = 1) -> None:
        with self._lock:
            self.progress.confirming(number, index, count)
        self._print(
            f"confirming the leaders ({index} of {count}): re-measuring #{number} in a fresh process "
            "(the recipe takes the best mean of the leaders' runs)"
        )

    def trial_finished(self, trial, summary) -> None:
        with self._lock:
            self.progress.trial_finished(trial, summary)
            line = self.progress.finished_line(trial)
        self._print(line)

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            if self.tty and self._shown:
                sys.stderr.write("\r\x1b[K")
                sys.stderr.flush()
                self._shown = False

    # --- drawing ----------------------------------------------------------------------------

    def _tick(self) -> None:
        while not self._stop.wait(self.TICK_S):
            self._draw()

    def _draw(self) -> None:
        if not self.tty or self._stop.is_set():
            return
        with self._lock:
            width = shutil.get_terminal_size((120, 20)).columns - 1
            sys.stderr.write("\r\x1b[K" + printable(self.progress.status_line())[:width])  # the configuration last
            sys.stderr.flush()
            self._shown = True

    def _print(self, line: str) -> None:
        """A permanent line: above the status line on a terminal."""
        if self.quiet:
            return
        with self._lock:
            if self.tty:
                sys.stderr.write("\r\x1b[K")
            sys.stderr.write(printable(line) + "\n")
            sys.stderr.flush()
        self._draw()
