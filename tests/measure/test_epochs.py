"""No DataLoader epoch begins inside a timed window: a new epoch of non-persistent workers forks
them again (seconds on a GPU's host, a stall in the window the configuration does not cost in a
real run, whose epochs are long). The synthetic corpus held 4096 x the context in tokens: 32
steps at GPT-2's largest budget, fewer than one window. It is sized for the run now (warm-up and
the longest first window), and the first epoch starts before anything is timed."""

from __future__ import annotations

import pytest
from torch.utils.data import DataLoader

import autotune.data.datasets
import autotune.measure.loop
from autotune.config import RunSpec, TrainConfig
from autotune.measure.loop import measure


@pytest.fixture
def events(monkeypatch) -> list[str]:
    """In order: each epoch begun (an iterator over the DataLoader: its workers start) and each
    timed window's start and end."""
    seen: list[str] = []
    real_iter, real_timed = DataLoader.__iter__, autotune.measure.loop._Run._timed

    def epoch(self):
        seen.append("epoch")
        return real_iter(self)

    def timed(self, *args, **kwargs):
        seen.append("window")
        try:
            return real_timed(self, *args, **kwargs)
        finally:
            seen.append("end")

    monkeypatch.setattr(DataLoader, "__iter__", epoch)
    monkeypatch.setattr(autotune.measure.loop._Run, "_timed", timed)
    # A small default corpus: 4 batches of the budget below, so that the run needs several epochs.
    monkeypatch.setattr(autotune.data.datasets, "default_min_tokens", lambda seq_len: 4 * 1024)
    return seen


def in_windows(events: list[str]) -> int:
    inside, count = False, 0
    for event in events:
        inside = {"window": True, "end": False}.get(event, inside)
        count += inside and event == "epoch"
    return count


@pytest.mark.parametrize("warmup", [0, 3])
@pytest.mark.slow
def test_no_epoch_begins_inside_a_timed_window(events, warmup):
    spec = RunSpec(model="gpt2-tiny", device="cpu", warmup=warmup, steps=10, min_time_s=0)
    m = measure(spec, TrainConfig(token_budget=1024, batching="packed"))
    assert m.outcome == "ok", m.reason
    assert "window" in events and in_windows(events) == 0, events
    assert m.epochs_during_timing == 0


def test_packed_epochs_are_as_long_as_the_data_not_the_materialized_stream():
    """A packed stream is materialized up to 4M tokens: 32 windows of GPT-2's largest budget were
    an epoch, whatever the data held. An epoch now has the data's own length in windows, the
    stream's taken in turn."""
    import torch

    from autotune.data.datasets import make_dataset
    from autotune.data.packing import PackedDataset

    data = make_dataset("synthetic", vocab_size=320, seq_len=32, seed=0, min_tokens=64 * 33)
    packed = PackedDataset(data, seq_len=32, max_tokens=8 * 32, with_documents=True)
    assert packed.windows == 8 and len(packed) == int(data.lengths.sum()) // 32 >= 64
    for i in (0, 3, 8, 11, len(packed) - 1):  # past the stream: its windows again, documents too
        window, documents = packed[i]
        again, its_documents = packed[i % 8]
        assert torch.equal(window, again) and torch.equal(documents, its_documents)
