"""The torch autotune declares (pyproject.toml) is the torch it runs on: every torch API its code
names exists in the installed torch, and .ci/run checks that on the oldest release the pin
admits (.ci/oldest_torch.sh runs the fast tier there). A pin below an API's release made every
trial there `crashed` (torch>=2.4 while the TF32 flags came in 2.9)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAMED = re.compile(r"\btorch(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


def resolve(name: str) -> object:
    """`torch.a.b.c`: the longest importable module prefix, then attributes."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attribute in parts[i:]:
            obj = getattr(obj, attribute)
        return obj
    raise ImportError(name)


def test_every_torch_api_autotune_names_exists_in_this_torch():
    import torch  # here, not at the top: collecting this module imports no torch (tests/test_collection.py)

    names = {m for path in (ROOT / "autotune").rglob("*.py") for m in NAMED.findall(path.read_text())}
    assert "torch.backends.cuda.matmul.fp32_precision" in names  # the scan sees the code
    missing = []
    for name in sorted(names):
        try:
            resolve(name)
        except (ImportError, AttributeError):
            missing.append(name)
    assert missing == [], f"torch {torch.__version__} lacks {missing}: raise the pin in pyproject.toml"


def test_the_ci_runs_the_oldest_torch_the_pin_admits():
    import torch

    pin = re.search(r'"torch>=(\d+)\.(\d+)"', (ROOT / "pyproject.toml").read_text())
    oldest = re.search(r"^OLDEST_TORCH=(\d+)\.(\d+)\.\d+$", (ROOT / ".ci" / "oldest_torch.sh").read_text(), re.M)
    assert pin and oldest and pin.groups() == oldest.groups()
    assert "oldest_torch_fast_tier" in (ROOT / ".ci" / "run").read_text()
    assert torch.__version__ >= f"{pin[1]}.{pin[2]}"  # this run's torch is one the pin admits
