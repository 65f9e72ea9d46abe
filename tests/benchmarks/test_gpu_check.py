"""benchmarks/gpu_check.sh: without a GPU, its dry run goes through the whole pipeline (bench,
search, verify, the table) on gpt2-tiny / CPU."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

pytestmark = pytest.mark.process


def test_gpu_check_dry_run(gpu_check_run):
    proc, out = gpu_check_run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first = proc.stdout.splitlines()[0]
    gpu_here = shutil.which("nvidia-smi") is not None and torch.cuda.is_available()
    assert first.startswith("GPU CHECK" if gpu_here else "DRY RUN"), first
    if not gpu_here:  # the dry run's own files (a GPU check's figures are the GPU session's to judge)
        assert "| baseline" in proc.stdout and "| verify of the search recipe" in proc.stdout
        for name in ("baseline", "checklist", "strong", "search", "verify"):
            assert json.loads((out / f"{name}.json").read_text()), name
        assert json.loads((out / "verify.json").read_text())["outcome"] == "ok"
