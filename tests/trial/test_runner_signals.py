"""A Ctrl-C while the runner waits on a trial stops it cleanly, wherever in the wait it lands."""

from __future__ import annotations

import subprocess
import sys

import pytest

from autotune.trial import runner
from tests.helpers import SignalWhileLocked, give_up_after


@pytest.mark.process
def test_a_ctrl_c_inside_popen_poll_still_lets_the_runner_reap_the_trial():
    # The exec fallback's trial is a subprocess.Popen. Were the KeyboardInterrupt raised inside
    # its poll(), the wait lock would stay taken and _reap's wait() would block for ever.
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    proc._waitpid_lock = SignalWhileLocked()
    SignalWhileLocked.reset()
    seen = {proc.pid: runner._start_time(proc.pid) or 0}
    try:
        with give_up_after(20, "the runner is stuck waiting on a trial it killed"):
            with pytest.raises(KeyboardInterrupt):
                runner._wait(proc, 30.0, None, seen)
            runner._reap(proc, seen, token="no-such-token")
    finally:
        proc.kill()
    assert SignalWhileLocked.fired and proc.returncode is not None
