"""autotune.measure.outcomes, where every outcome is decided: how a trial process's exit, an
exception inside a run and a measured peak become ok, oom, over_memory_limit, unsupported
or crashed, with a reason."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from autotune.errors import UnsupportedConfig
from autotune.measure import outcomes


def test_classify_exit():
    assert outcomes.classify_exit(-signal.SIGSEGV, "Fatal Python error") == (
        "crashed",
        "killed by SIGSEGV\nFatal Python error",
    )
    assert outcomes.classify_exit(-signal.SIGKILL, "") == (
        "oom",
        "killed by SIGKILL (most likely the kernel's OOM killer)",
    )
    # the kernel counted an OOM kill while it ran, or none: a kill -9 from outside is no OOM
    assert outcomes.classify_exit(-signal.SIGKILL, "", oom_killed=True) == (
        "oom",
        "killed by SIGKILL by the kernel's out-of-memory killer",
    )
    assert outcomes.classify_exit(-signal.SIGKILL, "", oom_killed=False) == (
        "killed",
        "killed by SIGKILL from outside (the kernel recorded no out-of-memory kill)",
    )
    assert outcomes.classify_exit(-signal.SIGABRT, "") == ("crashed", "killed by SIGABRT")
    assert outcomes.classify_exit(1, "Traceback ...\nImportError: x") == (
        "crashed",
        "exited with status 1\nTraceback ...\nImportError: x",
    )


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:  # noqa: BLE001 (a traceback, as measure() sees it)
        return caught


def test_classify_exception():
    import torch

    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore detail")
    assert outcomes.classify_exception(oom) == ("oom", "out of memory: CUDA out of memory. Tried to allocate 2.00 GiB")
    assert outcomes.classify_exception(MemoryError())[0] == "oom"
    assert (
        outcomes.classify_exception(RuntimeError("DefaultCPUAllocator: not enough memory: out of memory"))[0] == "oom"
    )
    assert outcomes.classify_exception(UnsupportedConfig("amp_dtype", "tf32 is CUDA only")) == (
        "unsupported",
        "amp_dtype: tf32 is CUDA only",
    )
    assert outcomes.classify_exception(RuntimeError("No available kernel. Aborting execution.")) == (
        "unsupported",
        "sdpa_backend: the forced attention backend cannot run these inputs (No available kernel. Aborting execution.)",
    )
    outcome, reason = outcomes.classify_exception(_raised(ValueError("boom")))
    assert outcome == "crashed" and reason.startswith("ValueError: boom\nTraceback") and Path(__file__).name in reason
    assert outcomes.classify_exception(RuntimeError("shape mismatch"))[0] == "crashed"


def test_classify_the_real_sdpa_error():
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(1, 2, 8, 4)
    with pytest.raises(RuntimeError) as info, sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        torch.nn.functional.scaled_dot_product_attention(q, q, q)  # no efficient kernel on CPU
    outcome, reason = outcomes.classify_exception(info.value)
    assert outcome == "unsupported"
    assert reason.startswith("sdpa_backend: the forced attention backend cannot run these inputs (")


def test_decide_measured():
    assert outcomes.decide_measured(900, 1000) == ("ok", None)
    assert outcomes.decide_measured(1000, 1000) == ("ok", None)  # at the limit fits
    assert outcomes.decide_measured(3 * 2**30, None) == ("ok", None)
    assert outcomes.decide_measured(None, 1000) == ("ok", None)
    assert outcomes.decide_measured(3 * 2**30, 2 * 2**30) == (
        "over_memory_limit",
        "peak memory 3.00 GiB is above the limit 2.00 GiB",
    )
    assert outcomes.decide_measured(1001, 1000) == ("over_memory_limit", "peak memory 1001 B is above the limit 1000 B")


def test_the_kernels_oom_kill_count_is_read_from_vmstat(tmp_path):
    from autotune.device.memory import oom_kill_count

    vmstat = tmp_path / "vmstat"
    vmstat.write_text("nr_free_pages 1\noom_kill 7\npgfault 3\n")
    assert oom_kill_count(str(vmstat)) == 7
    assert oom_kill_count(str(tmp_path / "none")) is None
    assert isinstance(oom_kill_count(), (int, type(None)))
