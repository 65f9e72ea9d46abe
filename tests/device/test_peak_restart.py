"""A phase's host peak (issue 16): `ProcessTreeMemory.restart_peak` counts the peak from then
on, the root's VmHWM included, so the timed window's peak is not the warm-up's."""

from __future__ import annotations

import numpy as np

from autotune.device.memory import ProcessTreeMemory

SPIKE = 96 * 2**20


def test_a_peak_before_the_restart_is_not_the_next_phase_peak():
    tree = ProcessTreeMemory()  # sampled by hand: no thread
    spike = np.ones(SPIKE // 8)  # touched: resident
    del spike  # freed at once (a large block is unmapped)
    before = tree.peak_bytes
    tree.restart_peak()
    assert tree.own_peak_valid, "this kernel refused /proc/self/clear_refs"
    after = tree.peak_bytes
    assert before - after > SPIKE // 2, (before, after)
    again = np.ones(SPIKE // 8)
    assert tree.peak_bytes - after > SPIKE // 2  # and what comes after counts
    del again
