"""Where a real GPU is visible (the suite run on the GPU machine, a CUDA build of torch), the
tests that run the CUDA paths on tests/cuda_fakes.py are skipped with the reason, through their
marker (`cuda_fakes`), and the fakes refuse to install at all: beside a live CUDA, a path the
fakes miss would reach the real device. Runs everywhere: the GPU is simulated."""

from __future__ import annotations

import pytest

from tests import conftest


class Item:
    """A collected test, as the setup hook reads it: its markers."""

    def __init__(self, *markers: str) -> None:
        self.markers = markers

    def get_closest_marker(self, name: str):
        return pytest.mark.cuda_fakes.mark if name in self.markers else None


def test_the_fakes_tests_are_skipped_where_a_real_gpu_is_visible(monkeypatch):
    import torch  # here, as the fakes (which import it): collecting this module imports no torch

    import tests.cuda_fakes as fakes

    monkeypatch.setattr(fakes, "_real_gpu", [])  # asked again, with a GPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "NVIDIA H200")
    with pytest.raises(pytest.skip.Exception, match=r"a real GPU is visible \(NVIDIA H200, torch "):
        conftest.pytest_runtest_setup(Item("cuda_fakes"))
    conftest.pytest_runtest_setup(Item())  # the other tests run
    with pytest.raises(RuntimeError, match="the CUDA fakes cannot be installed: a real GPU is visible"):
        fakes.install(fakes.FakeMachine(), monkeypatch.setattr)


def test_without_a_gpu_the_fakes_tests_run(monkeypatch):
    import torch

    import tests.cuda_fakes as fakes

    monkeypatch.setattr(fakes, "_real_gpu", [])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a CPU build, or a CUDA build without a GPU
    assert fakes.real_gpu_reason() is None
    conftest.pytest_runtest_setup(Item("cuda_fakes"))
