"""The trial process: `python -m autotune.trial MODE REQUEST RESULT PARENT_PID`.

    --measure   run one measurement and write it (a search trial, `verify`, the confirmation run)
    --generate  run one generation measurement and write it (a generation trial, its `verify`)
    --prompts   read a prompts file's token lengths (`data.prompts`; the tokenizers import torch)
    --rank      one rank of a launch of several (`trial.ranks`): the trial process of a
                measurement with nproc_per_node > 1 launches them through torch's elastic
                launcher, and aggregates what each writes
    --soak      run a recipe's configuration for an epoch or N steps, in windows (`verify --soak`)
    --probe     build the model and, for a file, the dataset, and write what the tuner needs of
                them (context length, depth, vocabulary): a user's factory runs here, under a
                timeout, never in the tuner (see `trial.probe`)

A fresh interpreter each time: a CUDA OOM or illegal access can poison a process; compile
caches and DataLoader workers leak across runs; a user's factory may raise, exit or hang. The
result is written as JSON, atomically; where the disk has no room for it, the process exits
with the error's number (ENOSPC 28, EDQUOT 122). The process dies with the tuner:
PR_SET_PDEATHSIG delivers SIGKILL if the parent goes first."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from typing import Any

from autotune.device.disk import FULL_DISK_ERRNOS
from autotune.trial.processes import die_with_parent


def main(argv: list[str]) -> int:
    started = time.time()
    mode = argv.pop(0) if argv and argv[0].startswith("--") else "--measure"
    if mode == "--rank":  # one rank of a launch (`trial.ranks`): its figures go to a file of its own
        from autotune.trial.ranks import rank_main

        return rank_main(argv[0], argv[1], int(argv[2]), float(argv[3]))
    request_path, result_path, parent_pid = argv[0], argv[1], int(argv[2])
    die_with_parent(parent_pid)
    with open(request_path, encoding="utf-8") as f:
        request = json.load(f)
    if mode == "--probe":
        payload = _probe(request)
    elif mode == "--soak":
        payload = _soak(request)
    elif mode == "--generate":
        payload = _generate(request, started)
    elif mode == "--prompts":
        payload = _prompts(request)
    else:
        payload = _measure(request, started, request_path, result_path)
    return _write_result(payload, result_path)


def _write_result(payload: dict[str, Any], result_path: str) -> int:
    """Write the result, atomically (the runner never reads half of one): 0. On a disk with no
    room for it, say so as Python would (the runner reads the path in the stderr tail, when that
    could be written) and exit with the error's number (ENOSPC or EDQUOT): the runner then
    knows why there is no result, and stops the search rather than count a crash."""
    tmp = result_path + ".tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(payload, f)
        os.replace(tmp, result_path)
    except OSError as exc:
        if exc.errno not in FULL_DISK_ERRNOS:
            raise
        with contextlib.suppress(OSError):  # the trial's stderr may be on the same full disk
            print(f"OSError: {OSError(exc.errno, exc.strerror, exc.filename or tmp)}", file=sys.stderr, flush=True)
        return exc.errno
    return 0


def _measure(request: dict[str, Any], started: float, request_path: str, result_path: str) -> dict[str, Any]:
    from autotune.config import RunSpec, TrainConfig
    from autotune.measure.loop import measure

    _threads_from_environment()
    if request["spec"].get("nproc_per_node", 1) > 1:  # one launch of N ranks (`trial.ranks`)
        from autotune.trial.ranks import launch

        def run(spec, cfg, info):
            t = time.perf_counter()
            result = launch(request, request_path, result_path)
            result.phase_s["total"] = time.perf_counter() - t  # the launch: the runner counts teardown after it
            return result

        return _measured(request, started, RunSpec, TrainConfig, run)
    return _measured(request, started, RunSpec, TrainConfig, measure)


def _threads_from_environment() -> None:
    """OMP_NUM_THREADS as a fresh interpreter reads it at torch's import: a trial forked from the
    fork server has torch imported already, with the server's thread count (the single-rank
    reference of a study of N ranks runs with one rank's share of the CPUs: `search.scaling`)."""
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        import torch

        if torch.get_num_threads() != int(threads):
            torch.set_num_threads(int(threads))


def _generate(request: dict[str, Any], started: float) -> dict[str, Any]:
    from autotune.config import GenerateConfig, GenerateSpec
    from autotune.measure.generation import measure_generation

    return _measured(request, started, GenerateSpec, GenerateConfig, measure_generation)


def _measured(request: dict[str, Any], started: float, spec_class, config_class, run) -> dict[str, Any]:
    """One measurement of the request's spec and config by `run` (training's, or generation's)."""
    from autotune.device import DeviceInfo
    from autotune.errors import AutotuneError
    from autotune.measure import outcomes
    from autotune.measure.measurement import Measurement

    ready = time.time()
    spec = spec_class.from_dict(request["spec"])
    cfg = config_class.from_dict(request["config"])
    info = DeviceInfo.from_dict(request["device"]) if request.get("device") else None
    try:
        result = run(spec, cfg, info)
    except AutotuneError as exc:  # bad input reaching a trial: record it, don't crash
        result = Measurement.failed(cfg.to_dict(), *outcomes.bad_input_in_trial(exc))
    result.phase_s["process_start"] = ready - started  # interpreter + imports, seen from inside
    return {"measurement": result.to_dict(), "started_at": started, "ready_at": ready}


def _prompts(request: dict[str, Any]) -> dict[str, Any]:
    from autotune.data.prompts import prompt_lengths
    from autotune.errors import UsageError

    try:
        return {"lengths": list(prompt_lengths(request["path"], vocab_size=request["vocab_size"]))}
    except UsageError as exc:
        return {"error": str(exc)}


def _soak(request: dict[str, Any]) -> dict[str, Any]:
    from autotune.config import RunSpec, TrainConfig
    from autotune.device import DeviceInfo
    from autotune.errors import AutotuneError
    from autotune.measure import outcomes
    from autotune.measure.soak_loop import SoakRun, soak

    spec = RunSpec.from_dict(request["spec"])
    cfg = TrainConfig.from_dict(request["config"])
    info = DeviceInfo.from_dict(request["device"]) if request.get("device") else None
    try:
        result = soak(spec, cfg, request.get("steps"), info)
    except AutotuneError as exc:
        result = SoakRun(*outcomes.bad_input_in_trial(exc))
    return {"soak": result.to_dict()}


def _probe(request: dict[str, Any]) -> dict[str, Any]:
    """What the tuner needs to know of a model (and of a data file), or why it cannot be had.
    Whatever the factory does (raise, even SystemExit) becomes one line of text."""
    from autotune.errors import UsageError

    name = request["model"]
    try:
        from autotune.data.datasets import make_dataset
        from autotune.model.introspect import ModelShape, model_shape
        from autotune.model.load import build_model
        from autotune.model.sizes import MODEL_SIZES

        seq_len = request.get("seq_len")
        if name in MODEL_SIZES:  # ours: its shape is known without building (gpt2-xl is 6 GB)
            c = MODEL_SIZES[name]
            shape = ModelShape(c.vocab_size, seq_len or c.block_size, c.n_layer, c.n_head, c.n_embd // c.n_head)
        else:
            shape = model_shape(build_model(name), seq_len)
        if request.get("data", "synthetic") != "synthetic":
            make_dataset(request["data"], vocab_size=shape.vocab_size, seq_len=shape.context_length, seed=0)
    except UsageError as exc:
        return {"error": str(exc)}
    except BaseException as exc:  # noqa: BLE001 - a user's factory may raise anything
        text = str(exc).strip().splitlines()
        return {"error": f"model {name!r}: building it raised {type(exc).__name__}" + (f": {text[0]}" if text else "")}
    return {
        "shape": {
            "vocab_size": shape.vocab_size,
            "context_length": shape.context_length,
            "n_layer": shape.n_layer,
            "n_head": shape.n_head,
            "head_dim": shape.head_dim,
        }
    }


if __name__ == "__main__":
    code = main(sys.argv[1:])
    # The result is on disk and the DataLoader workers are shut down: skip the interpreter's
    # shutdown (torch's finalizers and module teardown take ~1 s per trial; see
    # benchmarks/overhead.py) and let the runner's process-group kill clean up the rest.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
