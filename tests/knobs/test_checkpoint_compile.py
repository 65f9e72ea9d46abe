"""Checkpointed blocks under torch.compile, on the models people train (autotune's GPT, Hugging
Face GPT-2 and Llama), with every attention kernel a CPU runs: the recomputation in backward
runs the kernel the forward ran, whether dynamo traced the checkpoint or broke its graph inside
it (a Hugging Face Llama's attention does: issue G, CheckpointError at the first step)."""

from __future__ import annotations

import math

import pytest
import torch

from autotune.config import TrainConfig
from autotune.knobs.apply import training_context
from autotune.knobs.checkpoint import apply_checkpoint_knob
from autotune.model.load import build_model
from tests.examples.test_readme_snippets import documents, run, snippet
from tests.helpers import FLASH_OP, HF, MATH_OP, batch, tiny


class _Where:
    block_path = None
    device_kind = "cpu"


def test_a_block_checkpointed_for_compile_still_recomputes_with_the_forced_kernel():
    """The block compiled checkpoint of a recipe that forces a kernel, run eagerly, as dynamo runs
    it after a graph break inside the block: its recomputation, outside the step's context, must
    run the forced kernel (before: the default one, flash on a CPU, and checkpoint raised)."""
    model = tiny()
    cfg = TrainConfig(checkpoint_layers=(0, 1), compile_mode="default", sdpa_backend="math")
    apply_checkpoint_knob(model, cfg, _Where())
    x, y = batch()
    with training_context("cpu", cfg):
        loss = model(x, y)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        loss.backward()
    ops = {e.name for e in prof.events() if "attention" in e.name}
    assert MATH_OP in ops and FLASH_OP not in ops
    assert torch.backends.cuda.flash_sdp_enabled()  # the forced choice did not leak out


def _recipe_with(config: TrainConfig, workdir):
    from autotune.recipe import Recipe

    Recipe(config=config, model={"name": "gpt2-tiny", "seq_len": 128}, hardware={"kind": "cpu"}).save(
        workdir / "recipes" / "gpt2-nvidia-h200.json"
    )


@pytest.fixture
def loopdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


# The README's loop, dynamo and AOTAutograd for real (aot_eager: no inductor code generation),
# padded batches of changing widths. Every model with the forced math kernel (the one that broke)
# per block (autotune's GPT's blocks in its blocks+head scope, which compiles them as the blocks
# scope does, and its head besides); the Llama, whose graph breaks, with every CPU kernel per
# block, and as one graph with the forced math kernel. Every model x kernel x scope passed once
# (22 cases, 222 s on the 2-core machine under load, 2026-12-04); these 6 keep each mechanism for
# a seventh of that. Gone since: the Llama as one graph under forced flash (~30 s of CPU, as much
# as the per-block cases; each forced kernel's recompute runs per block, a whole-model graph's with
# the forced math kernel, and flash is the kernel a CPU picks by itself), and autotune's GPT in the
# blocks scope alone (~10 s; the same per-block compile as in blocks+head).
CASES = [
    ("gpt2-tiny", "math", "blocks+head"),
    ("hf:gpt2-tiny", "math", "blocks"),
    ("hf:llama-tiny", "auto", "blocks"),
    ("hf:llama-tiny", "math", "blocks"),
    ("hf:llama-tiny", "flash", "blocks"),
    ("hf:llama-tiny", "math", "model"),
]


@pytest.mark.compile
@pytest.mark.parametrize(("name", "kernel", "scope"), CASES)
def test_the_readme_loop_trains_checkpointed_compiled_blocks(name, kernel, scope, loopdir, fresh_dynamo, aot_eager):
    if name.startswith("hf:"):
        pytest.importorskip("transformers")
    config = TrainConfig(
        token_budget=1024,
        batching="padded",
        sdpa_backend=kernel,
        checkpoint_layers=(0, 1),
        compile_mode="default",
        compile_scope=scope,
    )
    _recipe_with(config, loopdir)
    torch.manual_seed(0)
    model = build_model(name)
    before = [p.detach().clone() for p in model.parameters()]
    ns = run(snippet("Applying a recipe in training code"), model=model, dataset=documents(24))
    assert math.isfinite(ns["loss"].item())
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, model.parameters()))


pytestmark = [*HF[:1]]
