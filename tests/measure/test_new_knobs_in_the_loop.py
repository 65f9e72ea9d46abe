"""The measuring loop runs what the new knobs say: document ids reach the model with every
packed step, and the chunked loss is what the head computes, in every training step the loop
runs (the shape warm-up's, the data warm-up's and the timed ones)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import autotune.measure.loop
import autotune.model.loss
from autotune.config import IGNORE_INDEX, RunSpec, TrainConfig
from autotune.measure.loop import measure

SEEN: list[tuple[torch.Tensor, torch.Tensor | None]] = []  # the training calls: input_ids, document_ids
PROBES: list[tuple[int, ...]] = []  # the calls without gradients: the label probe's, when the model loads


class DocumentRecorder(nn.Module):
    """A user model that takes document_ids (as the contract asks) and records them."""

    vocab_size = 320
    context_length = 64

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Embedding(320, 16)])
        self.head = nn.Linear(16, 320)

    def forward(self, input_ids, labels, document_ids=None):
        if torch.is_grad_enabled():
            SEEN.append((input_ids.clone(), None if document_ids is None else document_ids.clone()))
        else:
            PROBES.append(tuple(input_ids.shape))
        logits = self.head(self.layers[0](input_ids))
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)


def make_recorder() -> DocumentRecorder:
    return DocumentRecorder()


SPEC = RunSpec(model=f"{__name__}:make_recorder", device="cpu", warmup=1, steps=3, min_time_s=0)


def training_steps(m) -> int:
    """Every training step the loop ran: warm-up on each batch shape, then on real data, then
    the kept timed window (eager here: no window is timed again)."""
    assert m.retimed_windows == 0
    return m.shape_warmup_steps + m.warmup_steps + m.steps


@pytest.mark.slow
def test_packed_document_steps_pass_document_ids(monkeypatch):
    # FlexAttention cannot train on CPU; this model needs none, so the device rule is lifted
    # to show the loop's part: every step hands the model its batch's document ids.
    monkeypatch.setattr(autotune.measure.loop, "check_supported", lambda cfg, caps: None)
    SEEN.clear()
    PROBES.clear()
    m = measure(SPEC, TrainConfig(batching="packed", attention_mask="document", token_budget=256))
    assert m.outcome == "ok", m.reason
    assert PROBES and set(PROBES) == {(1, 8)}  # the label probe, when the model loads: no training step
    assert m.warmup_steps == SPEC.warmup and len(SEEN) == training_steps(m)
    # Its one shape is warmed like any other, with document ids: the masked graph is warm.
    assert m.shape_warmup_steps == 1
    for ids, docs in SEEN:
        assert docs is not None and docs.shape == ids.shape == (4, 64) and docs.dtype == torch.int32
        assert (docs[:, 0] == 0).all() and (docs.diff(dim=1) >= 0).all()
    assert sum(int(docs.max()) for _, docs in SEEN) > 0  # windows do cross boundaries
    SEEN.clear()
    m = measure(SPEC, TrainConfig(batching="packed", token_budget=256))
    assert m.outcome == "ok" and m.shape_warmup_steps == 1  # packed batches have one shape
    assert len(SEEN) == training_steps(m) and all(docs is None for _, docs in SEEN)


@pytest.mark.slow
def test_loss_impl_decides_what_the_head_runs(monkeypatch):
    calls: list[int] = []
    real = autotune.model.loss._chunked_forward

    def counting(hidden, *args):
        calls.append(hidden.shape[0])
        return real(hidden, *args)

    monkeypatch.setattr(autotune.model.loss, "_chunked_forward", counting)
    spec = RunSpec(model="gpt2-tiny", device="cpu", warmup=1, steps=2, min_time_s=0)
    m = measure(spec, TrainConfig(batching="packed", token_budget=1024))
    assert m.outcome == "ok" and calls == []
    m = measure(spec, TrainConfig(batching="packed", token_budget=1024, loss_impl="chunked"))
    assert m.outcome == "ok" and m.config["loss_impl"] == "chunked"
    assert m.shape_warmup_steps == 1 and m.warmup_steps == spec.warmup and m.retimed_windows == 0
    # Every step, the packed shape's warm-up step included, over the step's 8 x 128 tokens.
    assert calls == [1024] * (m.shape_warmup_steps + m.warmup_steps + m.steps)
