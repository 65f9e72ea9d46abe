"""A phase's host peak (issue 16): `ProcessTreeMemory.restart_peak` counts the peak from then
on, the root's VmHWM included, so the timed window's peak is not the warm-up's."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.helpers import repo_env

SPIKE = 96 * 2**20

# In a process of its own: the test session's process has children (the trials' fork server),
# and a tree's peak is then the sampled total, in which the root's VmHWM is not the subject.
PHASES = textwrap.dedent(f"""
    import numpy as np
    from autotune.device.memory import ProcessTreeMemory

    SPIKE = {SPIKE}
    tree = ProcessTreeMemory()  # sampled by hand: no thread
    spike = np.ones(SPIKE // 8)  # touched: resident
    del spike  # freed at once (a large block is unmapped)
    before = tree.peak_bytes
    tree.restart_peak()
    assert tree.own_peak_valid, "this kernel refused /proc/self/clear_refs"
    after = tree.peak_bytes
    assert before - after > SPIKE // 2, (before, after)
    again = np.ones(SPIKE // 8)
    assert tree.peak_bytes - after > SPIKE // 2, (after, tree.peak_bytes)  # and what comes after counts
    print("ok")
""")


@pytest.mark.process
def test_a_peak_before_the_restart_is_not_the_next_phase_peak():
    done = subprocess.run([sys.executable, "-c", PHASES], env=repo_env(), capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "ok", done.stderr[-2000:]
