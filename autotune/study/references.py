"""The names of the two reference trials that open every study (their configurations are the
tuner's: `search.references`), the user attr that marks them, and the flags of a speedup over
one that is no sound yardstick (`summary.StudySummary.speedup_flags`)."""

from __future__ import annotations

BASELINE, CHECKLIST = "baseline", "checklist"
REFERENCE_ATTR = "reference"  # the user attr naming a reference trial

# A speedup over a reference that was unstable, or that broke the memory limit, says less than its figure.
UNSTABLE, INFEASIBLE = "unstable", "infeasible"
SPEEDUP_FLAGS = (UNSTABLE, INFEASIBLE)
