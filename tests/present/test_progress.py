"""What `search` shows while it runs: from the first second, trial i of N, the elapsed time,
an estimate and the best so far (a live line on a terminal); one line per trial in logs."""

from __future__ import annotations

import io
import sys
from types import SimpleNamespace

import optuna

from autotune.config import TrainConfig
from autotune.present.progress import SearchProgress, format_duration
from autotune.present.text import config_summary
from autotune.study.record import TrialRecord

CONFIG = TrainConfig().to_dict()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def trial(number: int, tps: float, *, unstable: bool = False):
    measurement = {
        "config": CONFIG,
        "outcome": "ok",
        "tokens_per_sec": tps,
        "unstable": unstable,
        "step_time_cv": 0.318 if unstable else 0.01,
        "peak_memory_bytes": 2**28,
    }
    attrs = {
        "outcome": "ok",
        "config": CONFIG,
        "tokens_per_sec": tps,
        "peak_memory_bytes": 2**28,
        "measurement": measurement,
    }
    frozen = optuna.trial.create_trial(value=tps, user_attrs=attrs)
    frozen.number = number
    return TrialRecord.read(frozen)


def test_durations():
    assert [format_duration(s) for s in (0, 12.4, 125, 3725)] == ["0:00", "0:12", "2:05", "1:02:05"]


def test_trial_i_of_n_elapsed_estimate_and_best():
    clock = Clock()
    p = SearchProgress(4, clock=clock)
    assert p.status_line().endswith("| no best yet | preparing: checking the model, the device and the storage")
    assert p.status_line().startswith("0:00 elapsed, ~? left | no best yet")
    clock.now += 5
    p.trial_started(7, CONFIG)  # a resumed study: its trial numbers go on
    clock.now += 30
    assert "| no best yet | trial 1/4 (#7, 0:30): amp=float32" in p.status_line()
    assert "0:35 elapsed, ~? left" in p.status_line()
    first = trial(7, 84933.0)
    p.trial_finished(first, SimpleNamespace(best=first))
    # One trial took 30 s: three more, about 1:30.
    assert p.finished_line(first).startswith("[1/4 0:35 elapsed, ~1:30 left; best 84,933 tok/s (#7)] #7 ")
    p.trial_started(8, CONFIG)
    clock.now += 10
    assert "trial 2/4 (#8, 0:10)" in p.status_line() and "~1:20 left" in p.status_line()


def test_the_estimate_never_passes_the_timeout():
    clock = Clock()
    p = SearchProgress(100, timeout_s=120, clock=clock)
    assert "~2:00 left" in p.status_line()  # before any trial: the timeout is the bound
    p.trial_started(0, CONFIG)
    clock.now += 60
    t = trial(0, 10.0)
    p.trial_finished(t, SimpleNamespace(best=t))
    assert "~1:00 left" in p.finished_line(t)  # 99 trials of 60 s would be 1:39:00


def test_the_confirmation_runs_are_counted_and_estimated():
    """The leaders' re-measurements come after the last trial: the line says which of how many
    runs, and the estimate is what those runs take, not ~0:00."""
    clock = Clock()
    p = SearchProgress(2, clock=clock)
    for number in (0, 1):
        p.trial_started(number, CONFIG)
        clock.now += 10
        t = trial(number, 100.0 + number)
        p.trial_finished(t, SimpleNamespace(best=t))
    assert "~0:00 left" in p.status_line()  # the trials are done...
    p.confirming(1, 1, 3)  # ...three runs to go, of about 10 s each
    assert p.status_line().endswith("| confirming the leaders (1 of 3): re-measuring #1 in a fresh process")
    assert "~0:30 left" in p.status_line()
    clock.now += 4
    assert "~0:26 left" in p.status_line()
    clock.now += 6
    p.confirming(0, 2, 3)
    assert "| confirming the leaders (2 of 3)" in p.status_line() and "~0:20 left" in p.status_line()


def test_an_unstable_best_is_flagged():
    clock = Clock()
    p = SearchProgress(2, clock=clock)
    p.trial_started(0, CONFIG)
    t = trial(0, 5000.0, unstable=True)
    p.trial_finished(t, SimpleNamespace(best=t))
    line = p.finished_line(t)
    assert "best 5,000 (unstable) tok/s (#0)" in line and "UNSTABLE (step time CV 31.8%)" in line


def test_without_a_terminal_an_opening_line_then_one_per_trial(monkeypatch):
    from autotune.present.progress import TerminalProgress

    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    reporter = TerminalProgress(2, quiet=False, timeout_s=600, what="gpt2-tiny on cpu")
    assert err.getvalue() == ""  # until the search is validated: a refused one prints its error alone
    for number, tps in ((0, 100.0), (1, 300.0)):
        reporter.trial_started(number, TrainConfig())
        if number == 0:
            assert err.getvalue() == "search gpt2-tiny on cpu: 2 trials, at most 10:00\n"  # as the first starts
        t = trial(number, tps)
        reporter.trial_finished(t, SimpleNamespace(best=t))
    reporter.close()
    lines = err.getvalue().splitlines()
    assert len(lines) == 3 and "\r" not in err.getvalue()
    assert lines[1].startswith("[1/2 ") and lines[2].startswith("[2/2 ") and "best 300 tok/s (#1)" in lines[2]


def test_on_a_terminal_a_live_line_from_the_first_second(monkeypatch):
    from autotune.present.progress import TerminalProgress

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    err = Tty()
    monkeypatch.setattr(sys, "stderr", err)
    reporter = TerminalProgress(3, quiet=False)
    # drawn at once, before any trial: the times first
    assert err.getvalue().startswith("\r\x1b[K0:00 elapsed") and "preparing" in err.getvalue()
    reporter.trial_started(0, TrainConfig())
    assert "trial 1/3 (#0, 0:00)" in err.getvalue()
    t = trial(0, 100.0)
    reporter.trial_finished(t, SimpleNamespace(best=t))
    reporter.close()
    assert "[1/3 " in err.getvalue() and err.getvalue().endswith("\r\x1b[K")


def test_quiet_prints_nothing(monkeypatch):
    from autotune.present.progress import TerminalProgress

    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    reporter = TerminalProgress(2, quiet=True)
    reporter.trial_started(0, TrainConfig())
    reporter.trial_finished(trial(0, 1.0), SimpleNamespace(best=None))
    reporter.close()
    assert err.getvalue() == ""


def test_at_80_columns_the_line_shows_the_times_and_the_best_first_and_cuts_the_configuration():
    """Issue D, #5: the configuration came first and the line was cut at the terminal's width,
    so the elapsed time, the estimate and the best never showed at 80 or 120 columns."""
    clock = Clock()
    p = SearchProgress(4, clock=clock)
    p.trial_started(0, CONFIG)
    clock.now += 30
    t = trial(0, 84933.0)
    p.trial_finished(t, SimpleNamespace(best=t))
    long = {**CONFIG, "compile_mode": "max-autotune-no-cudagraphs", "attention": "flash", "token_budget": 16384}
    p.trial_started(1, long)
    clock.now += 12
    for width in (80, 120):
        line = p.status_line(width)
        assert len(line) <= width
        assert line.startswith("0:42 elapsed, ~1:18 left | best 84,933 tok/s (#0) | trial 2/4 (#1, 0:12)"), line
    assert p.status_line().endswith(config_summary(long))  # uncut: the configuration last


def test_the_estimate_counts_the_confirmation_runs_unless_they_are_off():
    """Up to three re-measurements of the leaders follow the last trial (`search.confirm`): the
    estimate counts them (each a mean trial), and leaves them out with --no-confirm (0 runs)."""
    estimates = {}
    for runs in (3, 0):
        clock = Clock()
        p = SearchProgress(2, clock=clock, confirm_runs=runs)
        p.trial_started(0, CONFIG)
        clock.now += 10
        t = trial(0, 100.0)
        p.trial_finished(t, SimpleNamespace(best=t))
        estimates[runs] = p.remaining()
    assert estimates == {3: 40.0, 0: 10.0}
