"""What torch compiles or records while training steps run: every such event in a timed
window is compiler time counted as training time.

torch announces each one through dynamo's compile callbacks (torch/_dynamo/callback.py),
with its trigger:

    dynamo                a frame compiled: the first compile, or a recompile on a new shape
    lazy_backward         a backward graph compiled at the first backward that needs it
    cudagraph_recording   reduce-overhead recording a CUDA graph (one per new shape)
    triton_autotuning     a kernel autotuned at its first launch (torch 2.13 does not emit it yet)

Only the outermost event of a nested group is announced, so each counts once. Counting
dynamo's graph counter instead would miss the lazy backward compiles and every CUDA graph
recording."""

from __future__ import annotations

from collections import Counter
from typing import Any


class CompileEvents:
    """Counts compile events while entered (a context manager; re-entrant uses nest)."""

    def __init__(self) -> None:
        self.by_trigger: Counter[str] = Counter()
        self._handler: Any = None

    @property
    def total(self) -> int:
        return sum(self.by_trigger.values())

    def _on_start(self, args: Any) -> None:
        trigger = getattr(args, "callback_trigger", None)
        self.by_trigger[getattr(trigger, "name", str(trigger)).lower()] += 1

    def __enter__(self) -> "CompileEvents":
        try:
            from torch._dynamo.callback import callback_handler
        except ImportError:  # a torch without dynamo compiles nothing
            return self
        callback_handler.register_start_callback(self._on_start)
        self._handler = callback_handler
        return self

    def __exit__(self, *exc: object) -> None:
        if self._handler is not None:
            self._handler.remove_start_callback(self._on_start)
            self._handler = None
