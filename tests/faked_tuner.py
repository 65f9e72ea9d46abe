"""A tuner process whose trials are faked from inside it: its sitecustomize (`SITE`, installed by
`helpers.with_site`) replaces the objective's `run_trial`. Each trial measures at once, each
faster than the one before (the last measured is the best). What the environment asks for
happens inside the tuner, at the end of a trial (index 0: its first):

    FAKE_HOLD_DIR=DIR                     the first trial writes DIR/running, then waits for DIR/go
    FAKE_FSIZE_AT=N, FAKE_FSIZE_DB=PATH   at trial N, PATH may no longer grow (RLIMIT_FSIZE), and
                                          the trial's record needs it to grow (`larger_than_a_page`)
"""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

SITE = "from tests.faked_tuner import install\ninstall()\n"


def larger_than_a_page(m) -> None:
    """A measurement of many batch shapes: storing it needs the study's file to grow."""
    m.extreme_shapes = [[1, width] for width in range(4000)]


def install() -> None:
    import autotune.search.training
    from autotune.trial.runner import TrialResult
    from tests.attack_helpers import measurement

    runs: list = []

    def run_trial(spec, cfg, **kwargs):
        runs.append(cfg)
        index = len(runs) - 1
        m = measurement(cfg, tokens_per_sec=1000.0 * len(runs))
        if index == 0 and os.environ.get("FAKE_HOLD_DIR"):
            _hold(Path(os.environ["FAKE_HOLD_DIR"]))
        if str(index) == os.environ.get("FAKE_FSIZE_AT"):
            limit = os.path.getsize(os.environ["FAKE_FSIZE_DB"])
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
            larger_than_a_page(m)
        return TrialResult("ok", None, m)

    autotune.search.training.run_trial = run_trial


def _hold(where: Path) -> None:
    (where / "running").touch()
    while not (where / "go").exists():
        time.sleep(0.05)
