"""autotune.units: fractions (tolerances) read as percentages or plain numbers."""

from __future__ import annotations

import pytest

from autotune.units import parse_fraction


@pytest.mark.parametrize("text,value", [("5%", 0.05), ("0.05", 0.05), ("12.5%", 0.125), ("0", 0.0)])
def test_parse_tolerance(text, value):
    assert parse_fraction(text, option="--tolerance") == pytest.approx(value)
