"""Shared test set-up: the repository root on sys.path, so a user-style model factory
`tests.fixture_models:make_llama` imports the way `autotune bench --model ...` imports one."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


import pytest  # noqa: E402

import autotune.measure.loop  # noqa: E402


class RecordingLoader:
    """Wraps the DataLoader that `measure()` builds and records every batch it yields, in
    order: the first `warmup_steps` are warm-up, the next `steps` the timed window."""

    def __init__(self, loader, record: "BatchRecord") -> None:
        self.loader = loader
        self.record = record

    def __iter__(self):
        for input_ids, labels in self.loader:
            self.record.shapes.append(tuple(input_ids.shape))
            self.record.tokens.append(int((labels != -100).sum()))
            yield input_ids, labels

    def __len__(self) -> int:
        return len(self.loader)


class BatchRecord:
    def __init__(self) -> None:
        self.loaders: list = []  # the real DataLoaders measure() built
        self.shapes: list[tuple[int, int]] = []
        self.tokens: list[int] = []

    def clear(self) -> None:
        self.loaders.clear()
        self.shapes.clear()
        self.tokens.clear()


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "compile: runs torch.compile (tens of seconds on a cold inductor cache)")


@pytest.fixture
def batch_record(monkeypatch) -> BatchRecord:
    """Spy on `measure()`'s data path: which loader it built and the batches it stepped on."""
    record = BatchRecord()
    real = autotune.measure.loop.build_dataloader

    def spy(*args, **kwargs):
        loader = real(*args, **kwargs)
        record.loaders.append(loader)
        return RecordingLoader(loader, record)

    monkeypatch.setattr(autotune.measure.loop, "build_dataloader", spy)
    return record


@pytest.fixture
def fresh_dynamo():
    """Compile tests start and end with dynamo's caches and counters cleared, so graph
    counts belong to the test and no compiled code leaks into the next test."""
    import torch._dynamo

    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
