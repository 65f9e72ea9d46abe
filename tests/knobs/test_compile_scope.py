"""compile_scope: what each scope compiles (dynamo graph counts), that checkpointing stays
inside the compiled graphs, unchanged state-dict keys and numerics, the shapes each batching
mode compiles for, and one real inductor run of the compiled head with the chunked loss.

Graph counts are dynamo's, whatever backend runs the graphs: most tests compile with
`aot_eager` (dynamo and AOTAutograd, the joint forward/backward graph with its checkpoints,
no inductor codegen: seconds instead of minutes on two cores); the last test uses inductor."""

from __future__ import annotations

import copy

import pytest
import torch

from autotune.config import IGNORE_INDEX, TrainConfig
from autotune.knobs.apply import apply_model_knobs
from autotune.knobs.compile import apply_compile, head_is_compiled, is_compiled
from autotune.model import build_model, find_blocks
from autotune.model.loss import chunked

pytestmark = pytest.mark.compile


class GraphCount:
    """Graphs dynamo made since the last reset (its counters outlive torch._dynamo.reset)."""

    def __init__(self) -> None:
        self.reset()

    @staticmethod
    def _total() -> int:
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])

    def reset(self) -> None:
        self.start = self._total()

    def __call__(self) -> int:
        return self._total() - self.start


@pytest.fixture
def graphs(fresh_dynamo) -> GraphCount:
    return GraphCount()


class Recorded:
    """Replaces torch.compile: records each call's options and the graphs dynamo hands the
    backend, and runs them with aot_eager. One backend object for every call, as inductor's
    per-call wrappers compare equal: dynamo then shares graphs across calls as it does for real."""

    real = staticmethod(torch.compile)

    def __init__(self) -> None:
        self.calls: list[dict] = []
        self.graph_code: list[str] = []

        def backend(gm, example_inputs):
            self.graph_code.append(gm.code)
            return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

        self.backend = backend

    def __call__(self, fn=None, **options):
        self.calls.append(options)
        return Recorded.real(fn, backend=self.backend, dynamic=options.get("dynamic"))


@pytest.fixture
def recorded(monkeypatch):
    rec = Recorded()
    monkeypatch.setattr(torch, "compile", rec)
    return rec


def batch(rows=4, width=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 320, (rows, width), generator=g)
    y = torch.randint(0, 320, (rows, width), generator=g)
    y[:, width - 5 :] = IGNORE_INDEX
    return x, y


def run(model, x, y):
    loss = model(x, y)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.fixture(scope="module")
def eager():
    torch.manual_seed(0)
    return build_model("gpt2-tiny")


@pytest.mark.parametrize(
    "scope, checkpoint, expected",
    [
        ("blocks", (), 1),  # identical blocks share one graph
        ("blocks+head", (), 2),  # ... plus the head and the loss
        ("model", (), 1),  # everything in one graph
        ("blocks", (1,), 2),  # a checkpointed block is another variant of the block graph
        ("model", (1,), 1),
    ],
)
def test_graph_counts_per_scope(recorded, graphs, eager, scope, checkpoint, expected):
    model = copy.deepcopy(eager)
    cfg = TrainConfig(compile_mode="default", compile_scope=scope, checkpoint_layers=checkpoint, batching="packed")
    apply_model_knobs(model, cfg)
    assert is_compiled(model) == (scope == "model")
    assert all(is_compiled(b) for b in find_blocks(model)) == (scope != "model")
    assert head_is_compiled(model) == (scope == "blocks+head")
    assert list(model.state_dict()) == list(eager.state_dict())  # in place: no _orig_mod. prefix
    x, y = batch()
    loss, grads = run(model, x, y)
    assert graphs() == expected
    ref_loss, ref_grads = run(copy.deepcopy(eager), x, y)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    for name, grad in ref_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    # Checkpointing came first: each checkpoint is inside a compiled graph (dynamo's
    # higher-order op), never an eager recomputation wrapped around compiled code.
    has_checkpoint = ["checkpoint" in code for code in recorded.graph_code]
    assert any(has_checkpoint) == bool(checkpoint), recorded.graph_code


def test_head_region_holds_norm_head_and_loss(recorded, eager):
    model = copy.deepcopy(eager)
    apply_model_knobs(model, TrainConfig(compile_mode="default", compile_scope="blocks+head", batching="packed"))
    run(model, *batch())
    head = [code for code in recorded.graph_code if "cross_entropy" in code or "log_softmax" in code]
    assert len(head) == 1 and "layer_norm" in head[0] and "linear" in head[0], recorded.graph_code


# One shape: torch's default (None), static while the shape holds, one dynamic recompile if a
# user's loader varies it (False would recompile per shape until the limit drops to eager).
@pytest.mark.parametrize("batching, dynamic", [("padded", True), ("packed", None), ("fixed", None)])
def test_padded_compiles_dynamic_static_otherwise(recorded, eager, batching, dynamic):
    model = copy.deepcopy(eager)
    apply_model_knobs(model, TrainConfig(compile_mode="default", compile_scope="blocks+head", batching=batching))
    assert recorded.calls and all(call["dynamic"] is dynamic for call in recorded.calls)
    assert all(call["mode"] == "default" for call in recorded.calls)


def test_compile_none_compiles_nothing(recorded, graphs, eager):
    model = copy.deepcopy(eager)
    apply_model_knobs(model, TrainConfig(compile_mode="none", loss_impl="chunked"))
    run(model, *batch())
    assert recorded.calls == [] and graphs() == 0


def test_inductor_head_with_chunked_loss_one_graph_across_widths(graphs, eager):
    """The strongest head: compiled, with the chunked loss, for padded batches (dynamic).
    The slice bounds are symbolic and their count fixed, so two widths share one head graph,
    with the loss and gradients of eager."""
    model = copy.deepcopy(eager)
    model.linear_cross_entropy = chunked(chunks=3)  # three slices even at gpt2-tiny's vocabulary
    apply_compile(model, "default", scope="blocks+head", dynamic=True)
    for width in (48, 64):
        x, y = batch(rows=4, width=width, seed=width)
        loss, grads = run(model, x, y)
        ref_loss, ref_grads = run(copy.deepcopy(eager), x, y)
        torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
        for name, grad in ref_grads.items():
            torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)
        model.zero_grad(set_to_none=True)
    assert graphs() == 2  # one block graph, one head graph: the second width reused both


@pytest.mark.parametrize("scope, expected", [("blocks", 1), ("model", 1)])
def test_document_mask_traces_into_the_compiled_graphs(recorded, graphs, eager, scope, expected):
    """FlexAttention's block mask passes into compiled blocks, and is built inside the
    whole-model graph, without a graph break (forward only: CPU has no FlexAttention
    backward; on CUDA the same graphs train)."""
    x, _ = batch(rows=2, width=128)
    docs = torch.zeros(2, 128, dtype=torch.int32)
    docs[:, 50:] = 1
    with torch.no_grad():
        ref = eager.eval()(x, document_ids=docs)  # eager FlexAttention runs through dynamo itself
        model = copy.deepcopy(eager)
        apply_model_knobs(model, TrainConfig(compile_mode="default", compile_scope=scope, batching="packed"))
        graphs.reset()
        out = model(x, document_ids=docs)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert graphs() == expected
