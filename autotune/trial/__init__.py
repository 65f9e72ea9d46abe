"""One trial, isolated: the parent side (`runner.run_trial`) starts `python -m autotune.trial`
(the child, `__main__`) in a fresh process and its own process group, and turns whatever
happens into a `TrialResult` with an outcome."""

from __future__ import annotations
