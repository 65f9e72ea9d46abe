"""autotune.knobs.compile (and apply): compile_mode none leaves the blocks eager; otherwise each
block is compiled and runs compiled graphs, and a compiled padded run does not recompile while
timed. torch.compile on 2 CPU cores costs tens of seconds per new graph (inductor then caches
it under /tmp): the two compile tests are marked `compile`."""

from __future__ import annotations

import copy

import pytest
import torch

from autotune.config import TrainConfig
from autotune.data.batching import build_dataloader, distinct_batch_shapes
from autotune.data.datasets import make_dataset
from autotune.knobs.apply import apply_model_knobs
from autotune.knobs.compile import apply_compile, is_compiled
from autotune.measure.loop import measure
from autotune.model.introspect import find_blocks
from tests.helpers import batch, tiny, tiny_spec


def compiled_graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def test_compile_none_leaves_blocks_eager():
    model = tiny()
    apply_model_knobs(model, TrainConfig(compile_mode="none"))
    assert not any(is_compiled(b) for b in find_blocks(model))
    before = compiled_graphs()
    x, y = batch()
    model(x, y).backward()
    assert compiled_graphs() == before


COMPILE_RUN_CFG = TrainConfig(compile_mode="default", batching="padded", token_budget=1024)


def first_measured_shape(cfg: TrainConfig) -> tuple[int, int]:
    """(rows, width) of the first batch measure() steps on for gpt2-tiny, seed 0."""
    dataset = make_dataset("synthetic", vocab_size=320, seq_len=128, seed=0)
    x, _ = next(iter(build_dataloader(dataset, cfg, seq_len=128, seed=0)))
    return tuple(x.shape)


@pytest.mark.compile
@pytest.mark.parametrize("scope", ["blocks+head", "model"])  # blocks+head: the blocks and the head
def test_a_dynamic_compile_traces_once(scope, fresh_dynamo, aot_eager):
    """dynamic=True (padded batches) makes every Python float dynamo meets an input of the
    graph, LayerNorm's eps too; layer_norm needs a real float, so dynamo traced the whole
    graph, gave up and traced it again (seconds of a compiled trial's warm-up, on any
    device). The first compile now keeps such floats constant: one trace per graph."""
    from torch._dynamo.utils import counters

    model = tiny()
    apply_compile(model, "default", scope=scope, dynamic=True)
    x, y = batch()
    model(x, y).backward()
    traced = dict(counters["aot_autograd"])  # graphs handed on (total) and compiled (ok)
    assert traced["total"] == traced["ok"] >= 1, traced
    model(*batch(width=40, rows=3)).backward()  # another shape: the same graphs
    assert dict(counters["aot_autograd"]) == traced
    # Then the blocks' and the head's compiled calls are torch's own: nothing added per step.
    compiled_calls = [b._compiled_call_impl for b in find_blocks(model) if is_compiled(b)]
    compiled_calls += [model._compiled_call_impl] if is_compiled(model) else []
    compiled_calls += [model.head_loss] if scope == "blocks+head" else []
    assert compiled_calls and all(hasattr(c, "_torchdynamo_orig_callable") for c in compiled_calls)


@pytest.mark.compile
def test_compile_compiles_each_block_and_runs_compiled_graphs(fresh_dynamo):
    eager = tiny()
    model = copy.deepcopy(eager)
    apply_compile(model, "default")
    assert all(is_compiled(b) for b in find_blocks(model))
    assert not is_compiled(model)  # per block: embedding, head and loss stay eager
    assert list(model.state_dict()) == list(eager.state_dict())
    before = compiled_graphs()
    # The shape the compiled measure() run below starts with: its first graph is then the
    # one compiled here, and inductor's cache pays for it once.
    x, y = batch(*reversed(first_measured_shape(COMPILE_RUN_CFG)))
    loss = model(x, y)
    loss.backward()
    # Identical blocks share one traced graph; dynamo really compiled something.
    assert compiled_graphs() - before == 1
    reference = eager(x, y)
    reference.backward()
    torch.testing.assert_close(loss, reference, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(
        model.transformer.h[0].attn.c_attn.weight.grad,
        eager.transformer.h[0].attn.c_attn.weight.grad,
        rtol=1e-3,
        atol=1e-5,
    )
    # The same shape again: no new graph.
    model(x, y).backward()
    assert compiled_graphs() - before == 1


@pytest.mark.compile
def test_compiled_padded_run_does_not_recompile_while_timed(fresh_dynamo, batch_record):
    """Padded batches vary in width; a compiled run must not compile while timed (that would
    time the compiler). Warm-up steps on a batch of every distinct shape the sampler will
    produce, pass after pass until a pass compiles nothing, so the timed steps, whatever
    widths they meet, run graphs made before the clock started."""
    spec = tiny_spec(steps=6)
    m = measure(spec, COMPILE_RUN_CFG)
    assert m.outcome == "ok", m.reason
    shapes = distinct_batch_shapes(batch_record.loaders[0])
    assert shapes is not None and len({w for _, w in shapes}) >= 2  # padded: several widths
    # Whole passes over the shapes, at least two: the first compiles, the last compiles nothing.
    assert m.shape_warmup_steps > 0 and m.shape_warmup_steps % len(shapes) == 0
    assert m.shape_warmup_steps >= 2 * len(shapes)
    assert m.warmup_steps == spec.warmup
    timed = batch_record.shapes[m.warmup_steps :]
    assert len(timed) == m.steps and set(timed) <= set(shapes), (shapes, timed)  # each timed shape was warmed
    assert len({w for _, w in timed}) >= 2, timed  # and the window met more than one width
    assert m.recompiles_during_timing == 0 and m.retimed_windows == 0
    assert m.compile_time_s > 0
    assert m.config["compile_mode"] == "default"
