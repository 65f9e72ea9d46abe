"""The names of the two reference trials that open every study (their configurations are the
tuner's: `search.references`), and the user attr that marks them."""

from __future__ import annotations

BASELINE, CHECKLIST = "baseline", "checklist"
REFERENCE_ATTR = "reference"  # the user attr naming a reference trial
