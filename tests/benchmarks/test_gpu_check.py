"""benchmarks/gpu_check.sh: without a GPU, its dry run goes through the whole pipeline (bench,
search, verify, the table) on gpt2-tiny / CPU."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
import torch

from tests.helpers import ROOT

pytestmark = pytest.mark.process


def test_gpu_check_dry_run(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path)}
    env.pop("AUTOTUNE_WHEELS", None)
    proc = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first = proc.stdout.splitlines()[0]
    gpu_here = shutil.which("nvidia-smi") is not None and torch.cuda.is_available()
    assert first.startswith("GPU CHECK" if gpu_here else "DRY RUN"), first
    if not gpu_here:  # the dry run's own files (a GPU check's figures are the GPU session's to judge)
        assert "| baseline" in proc.stdout and "| verify of the search recipe" in proc.stdout
        for name in ("baseline", "checklist", "strong", "search", "verify"):
            assert json.loads((tmp_path / f"{name}.json").read_text()), name
        assert json.loads((tmp_path / "verify.json").read_text())["outcome"] == "ok"
