"""What people and scripts read: formatting (`text`), summaries of a measurement, a search
and a study (`summaries`), studies side by side (`compare`), knob importance (`importance`),
the HTML/PNG report (`report`) and optuna-dashboard (`dashboard`). Nothing here imports
torch or runs a trial."""

from __future__ import annotations
