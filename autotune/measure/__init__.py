"""Measuring one training run: the loop (`loop.measure`, which imports torch), the training
step it shares with `profile`, MFU (`flops`), the typed result (`Measurement`) and every
outcome decision (`outcomes`). This package's own import loads no torch: `Measurement` and
`outcomes` are read by the study side too."""

from __future__ import annotations

from autotune.measure.measurement import Measurement

__all__ = ["Measurement"]
