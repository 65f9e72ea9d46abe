"""Gradient and parameter parity of 2 ranks (CPU, gloo, OMP_NUM_THREADS=1, gpt2-tiny in fp32)
against one process taking the same global batch: k AdamW steps through autotune's own step
(`measure.step.TrainStep`), the model wrapped by `knobs.parallel`. DDP; DDP accumulating under
no_sync() with its bucket knobs; DDP with static_graph; FSDP2; FSDP2 accumulating with
set_requires_gradient_sync and reshard_after_forward=false. Every gradient an optimizer step
applied and every parameter after the steps within 1e-6 of the single process's: a reduction
that summed instead of averaging (FSDP2's reduce-scatter on gloo, pytorch#162338) or a skipped
or doubled all-reduce is N times off, far outside it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.helpers import repo_env
from tests.parity_ranks import reference

pytestmark = pytest.mark.process

STEPS = 2
CASES = [
    ({"parallelism": "ddp"}, 1),
    ({"parallelism": "ddp", "bucket_cap_mb": 1, "gradient_as_bucket_view": True}, 2),
    ({"parallelism": "ddp", "static_graph": True, "bucket_cap_mb": 1}, 1),
    ({"parallelism": "fsdp2"}, 1),
    ({"parallelism": "fsdp2", "reshard_after_forward": False}, 2),
]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """One launch of 2 ranks training every case (a launch costs seconds of imports), rank 0's results."""
    out = tmp_path_factory.mktemp("parity") / "ranks.pt"
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
        + ["-m", "tests.parity_ranks", str(out), json.dumps(CASES), str(STEPS)],
        cwd=os.getcwd(),
        env=repo_env(OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(out)


@pytest.fixture(scope="module")
def alone():
    torch.set_num_threads(1)
    return {accumulation: reference(STEPS, 2 * accumulation) for accumulation in {a for _, a in CASES}}


@pytest.mark.parametrize("case", range(len(CASES)), ids=[f"{c['parallelism']}-{c}-x{a}" for c, a in CASES])
def test_two_ranks_train_as_one_process_on_the_same_global_batch(two_ranks, alone, case):
    config, accumulation = CASES[case]
    got, want = two_ranks[case], alone[accumulation]
    assert "error" not in got, got.get("error")
    assert len(got["grads"]) == len(want["grads"]) == STEPS  # one optimizer step per global batch
    for step, (ours, theirs) in enumerate(zip(got["grads"], want["grads"])):
        for i, (a, b) in enumerate(zip(ours, theirs)):
            assert torch.allclose(a, b, rtol=0, atol=1e-6), (step, i, (a - b).abs().max().item(), a.norm() / b.norm())
    for i, (a, b) in enumerate(zip(got["params"], want["params"])):
        assert torch.allclose(a, b, rtol=0, atol=1e-6), (i, (a - b).abs().max().item())
