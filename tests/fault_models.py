"""Models that fail on purpose, loaded as `--model tests.fault_models:<factory>` by the search
tests: each is gpt2-tiny with a forward that misbehaves in one way a real trial can.

    segfault     the process dies of SIGSEGV (after a line on stderr, so the reason shows it)
    hang         starts a child process (like a DataLoader worker), then never returns
    memory_hog   holds a buffer proportional to the batch's token positions: peak RSS
                 follows token_budget (~64 KiB per position, capped at ~1.2 GB)
    raises       raises ValueError("boom")
    chatty       gpt2-tiny that prints to stdout when built and at every step, through Python's
                 print and through file descriptor 1 (as C code prints)
    host_hog     a factory that allocates HOST_HOG_BYTES of host memory, 32 MiB at a time,
                 before it returns gpt2-tiny (as one building a far bigger model would)
    rank_1_raises   gpt2-tiny that raises ValueError("boom on rank 1") in forward on rank 1 of a
                    launch only (the others wait for it in a collective)
    rank_1_hangs    gpt2-tiny whose forward never returns on rank 1 only
                 (both write, when RANKS_DIR_ENV names a folder, each rank's pid and rendezvous
                 port there as they are built: rank-K.pid holds "PID PORT")
    full_disk    gpt2-tiny; from its second build on (the probe builds it first), the disk of
                 the trial's folder is full: a file opened there for writing cannot be written
                 (ENOSPC), as when TMPDIR fills up while the trial runs

The trial process imports them from its working directory (the test's tmp dir), so the
tests put the repository root on PYTHONPATH."""

from __future__ import annotations

import builtins
import errno
import io
import os
import signal
import subprocess
import sys
import tempfile
import time

import torch

from autotune.model.gpt import GPT
from autotune.model.sizes import MODEL_SIZES
from tests.fault_env import BUILDS_ENV, PIDFILE_ENV, RANKS_DIR_ENV

HOG_BYTES_PER_TOKEN = 64 * 1024
HOG_CAP_BYTES = 1_200_000_000
HOST_HOG_BYTES = 1536 << 20  # 1.5 GiB: far above a 256 MiB limit, well within this machine


class _Tiny(GPT):
    def __init__(self) -> None:
        super().__init__(MODEL_SIZES["gpt2-tiny"])


class Segfault(_Tiny):
    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        print("fault_models: about to segfault", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGSEGV)
        time.sleep(10)  # the signal is delivered before this returns
        raise AssertionError("unreachable")


class Hang(_Tiny):
    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        # A child in the trial's process group, as a DataLoader worker would be: the runner
        # must kill it together with the trial.
        child = subprocess.Popen(["sleep", "1000"], stdin=subprocess.DEVNULL)
        pidfile = os.environ.get(PIDFILE_ENV)
        if pidfile:  # whole when it appears: a test waits for it
            with open(pidfile + ".tmp", "w", encoding="utf-8") as f:
                f.write(str(child.pid))
            os.replace(pidfile + ".tmp", pidfile)
        while True:
            time.sleep(60)


class MemoryHog(_Tiny):
    """Peak RSS = the process's own + HOG_BYTES_PER_TOKEN x the largest batch's token
    positions (rounded up to a power of two). The buffer is kept on the model across steps and
    only replaced (freed first) when a batch is larger, so the peak follows token_budget, not
    the number of steps, and
    a step costs no more than a tiny one once the buffer is there."""

    def __init__(self) -> None:
        super().__init__()
        self._hoard: list[torch.Tensor] = []

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        # Rounded up to a power of two: batches of one budget differ by a few positions, and
        # one allocation per trial keeps the steps cheap.
        positions = 1 << max(0, input_ids.numel() - 1).bit_length()
        nbytes = min(positions * HOG_BYTES_PER_TOKEN, HOG_CAP_BYTES)
        if not self._hoard or self._hoard[0].numel() < nbytes:
            self._hoard.clear()
            self._hoard.append(torch.ones(nbytes, dtype=torch.uint8))  # ones: every page is touched
        # The loss on one sequence: the model's compute stays small whatever the budget.
        return super().forward(input_ids[:1], None if labels is None else labels[:1])


class Raises(_Tiny):
    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        raise ValueError("boom")


def segfault() -> GPT:
    return Segfault()


def hang() -> GPT:
    return Hang()


def memory_hog() -> GPT:
    return MemoryHog()


def raises() -> GPT:
    return Raises()


def host_hog() -> GPT:
    hoard = []
    while sum(len(b) for b in hoard) < HOST_HOG_BYTES:
        hoard.append(bytearray(b"x") * (32 << 20))  # written: every page is resident
        time.sleep(0.01)  # growing, as a build does: the watchdog polls every 50 ms
    time.sleep(1.0)
    return _Tiny()


class Chatty(_Tiny):
    def __init__(self) -> None:
        super().__init__()
        print("chatty: built")

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        print("chatty: a step")
        os.write(1, b"chatty: from C\n")
        return super().forward(input_ids, labels)


def chatty() -> GPT:
    return Chatty()


class _FullFile(io.TextIOWrapper):
    """A file on a full disk: it opens, but nothing can be written to it."""

    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as write(2) says it: no file name


def full_disk() -> GPT:
    with open(os.environ[BUILDS_ENV], "a", encoding="utf-8") as f:
        f.write("built\n")
    with open(os.environ[BUILDS_ENV], encoding="utf-8") as f:
        builds = len(f.read().splitlines())
    if builds >= 2:
        real = builtins.open
        folder = os.path.join(tempfile.gettempdir(), "autotune-trial-")

        def open_on_a_full_disk(file, mode="r", *args, **kwargs):
            handle = real(file, mode, *args, **kwargs)
            if str(file).startswith(folder) and any(m in mode for m in "wax") and "b" not in mode:
                handle = _FullFile(handle.detach(), encoding=handle.encoding)
            return handle

        builtins.open = open_on_a_full_disk
    return _Tiny()


class _OnRank1(_Tiny):
    """gpt2-tiny that misbehaves on rank 1 of a launch (`misbehave`), after noting each rank."""

    def __init__(self) -> None:
        super().__init__()
        folder = os.environ.get(RANKS_DIR_ENV)
        if folder and "RANK" in os.environ:
            path = os.path.join(folder, f"rank-{os.environ['RANK']}.pid")
            with open(path + ".tmp", "w", encoding="utf-8") as f:
                f.write(f"{os.getpid()} {os.environ.get('MASTER_PORT', '')}")
            os.replace(path + ".tmp", path)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        if os.environ.get("RANK") == "1":
            self.misbehave()
        return super().forward(input_ids, labels)

    def misbehave(self) -> None:
        raise NotImplementedError


class Rank1Raises(_OnRank1):
    def misbehave(self) -> None:
        raise ValueError("boom on rank 1")


class Rank1Hangs(_OnRank1):
    def misbehave(self) -> None:
        while True:
            time.sleep(60)


def rank_1_raises() -> GPT:
    return Rank1Raises()


def rank_1_hangs() -> GPT:
    return Rank1Hangs()


class ThreadsReporter(_Tiny):
    """Writes the threads its forward passes run on to the file AUTOTUNE_TEST_BUILDS names."""

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        with open(os.environ[BUILDS_ENV], "a", encoding="utf-8") as f:
            f.write(f"{torch.get_num_threads()}\n")
        return super().forward(input_ids, labels)


def threads_reporter() -> GPT:
    return ThreadsReporter()
