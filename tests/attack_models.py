"""Models and factories that attack the tuner, loaded as `--model tests.attack_models:<factory>`
(the trial and probe processes import them; the tests put the repository root on PYTHONPATH).

    nan_loss            gpt2-tiny whose loss is NaN from the first step (fast, and "trains" nothing)
    new_session_hang    starts a child in a new session (setsid: out of the trial's process
                        group), writes its pid to $AUTOTUNE_TEST_PIDFILE, then hangs
    daemonizing         a factory that double-forks a daemon (orphaned, new session) before
                        returning gpt2-tiny: the probe ends normally, the daemon must not live on
    factory_raises      a factory that raises ValueError("factory boom")
    factory_exits       a factory that ends the process with os._exit(0)
    factory_hangs       a factory that never returns
"""

from __future__ import annotations

import os
import subprocess
import time

import torch

from autotune.model.gpt import GPT
from autotune.model.sizes import MODEL_SIZES

PIDFILE_ENV = "AUTOTUNE_TEST_PIDFILE"


class _Tiny(GPT):
    def __init__(self) -> None:
        super().__init__(MODEL_SIZES["gpt2-tiny"])


class NanLoss(_Tiny):
    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        loss = super().forward(input_ids, labels)
        return loss * float("nan")


class NewSessionHang(_Tiny):
    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        child = subprocess.Popen(["sleep", "1000"], stdin=subprocess.DEVNULL, start_new_session=True)
        _write_pid(child.pid)
        while True:
            time.sleep(60)


def _write_pid(pid: int) -> None:
    path = os.environ.get(PIDFILE_ENV)
    if path:
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.write(str(pid))
        os.replace(path + ".tmp", path)


def _daemon() -> None:
    """A classic double fork: the grandchild is orphaned (reparented to init) in a new session."""
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            _write_pid(os.getpid())
            os.execvp("sleep", ["sleep", "1000"])
        os._exit(0)
    os.wait()


def nan_loss() -> GPT:
    return NanLoss()


def new_session_hang() -> GPT:
    return NewSessionHang()


def daemonizing() -> GPT:
    _daemon()
    return _Tiny()


def factory_raises() -> GPT:
    raise ValueError("factory boom")


def factory_exits() -> GPT:
    os._exit(0)


def factory_hangs() -> GPT:
    while True:
        time.sleep(60)
